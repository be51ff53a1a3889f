// upstream kube-proxy watches its --config file (fsnotify) and, on a write or a rename, ends
// with "content of the proxy server's configuration file was updated" and exit status 1, so
// that the pod restarts with the new configuration. kproxy does the same: fs.watch for the
// event (a ConfigMap update swaps the file's symlink target: a rename), and a 1 s stat poll
// as a fallback where inotify is not available, comparing the content so that a touch or a
// rewrite with the same bytes does not restart the proxy. A writer truncates before it writes,
// so the content is read only once the events have settled (settleMs after the last one):
// reading at the first event would see an empty file and restart for nothing.
import { watch, watchFile, unwatchFile, readFileSync, type FSWatcher } from 'node:fs';
import { createHash } from 'node:crypto';

export const CONFIG_CHANGED_MESSAGE = "content of the proxy server's configuration file was updated";

function digest(path: string): string {
  try {
    return createHash('sha256').update(readFileSync(path)).digest('hex');
  } catch {
    return 'unreadable';
  }
}

/** Calls onChange once when the file's content changes (or it goes away); returns a stop function. */
export function watchConfigFile(path: string, onChange: () => void, pollMs = 1000, settleMs = 300): () => void {
  const initial = digest(path);
  let fired = false;
  let watcher: FSWatcher | undefined;
  let timer: NodeJS.Timeout | undefined;
  const settled = () => {
    timer = undefined;
    if (fired || digest(path) === initial) return;
    fired = true;
    stop();
    onChange();
  };
  const check = () => {
    if (fired) return;
    if (timer) clearTimeout(timer);
    timer = setTimeout(settled, settleMs);
    timer.unref?.();
  };
  const stop = () => {
    if (timer) clearTimeout(timer);
    watcher?.close();
    unwatchFile(path, check);
  };
  try {
    watcher = watch(path, { persistent: false }, () => check());
    watcher.on('error', () => check());
  } catch {
    // no inotify here: the poll below still sees the change
  }
  watchFile(path, { persistent: false, interval: pollMs }, check);
  return stop;
}
