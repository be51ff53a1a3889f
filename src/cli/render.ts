import { once } from 'node:events';
import { type CommonOptions, allocationConfig, effectiveConfig, resolveNodeName } from './options.ts';
import { modes } from '../modes/registry.ts';
import { plansFromManifests } from './state.ts';
import { familySectionMarker } from '../sync/controller.ts';
import { kproxyError } from '../errors.ts';

export async function renderCommand(o: CommonOptions): Promise<void> {
  const cfg = effectiveConfig(o);
  if (!o.manifests) throw kproxyError('KPROXY_RENDER_INPUT', 'render needs --manifests DIR');
  // A dual-stack state prints a section per family, IPv4 first, each opened by the marker
  // line `# ==== kproxy IPv4 ====` (a comment in every payload format) and holding that
  // family's payload as it is; a single-family state prints its payload alone.
  const alloc = { config: allocationConfig(o), statePath: o.manifestsState };
  const inputs = await plansFromManifests(o.manifests, cfg, resolveNodeName(cfg), o.nodeIp, undefined, undefined, alloc);
  const mode = modes[cfg.mode];
  const text = (i: (typeof inputs)[number]) => mode.renderParts?.(i) ?? [mode.render(i)];
  if (inputs.length === 1) {
    for (const part of text(inputs[0])) await write(part);
    return;
  }
  for (const input of inputs) {
    // familySection, written as the payload is made
    await write(`${familySectionMarker(input.node.family)}\n`);
    let last = '';
    for (const part of text(input)) {
      if (!part) continue;
      await write(part);
      last = part;
    }
    if (last && !last.endsWith('\n')) await write('\n');
  }
}

/** Writes to stdout, waiting while its buffer is full: a part of tens of MB is not queued behind others. */
async function write(text: string): Promise<void> {
  if (!process.stdout.write(text)) await once(process.stdout, 'drain');
}
