import type { CommonOptions } from './main.ts';
import { effectiveConfig, resolveNodeName } from './main.ts';
import { modes } from '../proxy/registry.ts';
import { planFromManifests } from './state.ts';
import { kproxyError } from '../errors.ts';

export async function renderCommand(o: CommonOptions): Promise<void> {
  const cfg = effectiveConfig(o);
  if (!o.manifests) throw kproxyError('KPROXY_RENDER_INPUT', 'render needs --manifests DIR');
  const input = await planFromManifests(o.manifests, cfg, resolveNodeName(cfg), o.nodeIp);
  process.stdout.write(modes[cfg.mode].render(input));
}
