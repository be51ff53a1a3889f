import { type CommonOptions, allocationConfig, effectiveConfig, resolveNodeName } from './options.ts';
import { modes } from '../modes/registry.ts';
import { plansFromManifests } from './state.ts';
import { familySection } from '../sync/controller.ts';
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
  if (inputs.length === 1) process.stdout.write(mode.render(inputs[0]));
  else process.stdout.write(inputs.map((i) => familySection(i.node.family, mode.render(i))).join(''));
}
