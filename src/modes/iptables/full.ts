// The full sync: every chain kproxy owns written, as upstream's syncProxyRules does (one
// iptables-restore --noflush), or, with `chunkLines` (the nf_tables backend), in several
// restores of whole services (chunkedPayloads). Pure.
import type { ProxyState } from '../../core/model.ts';
import type { IptablesOptions } from './options.ts';
import { BlockCache } from './blocks.ts';
import {
  collectRuleset, DISPATCH_CHAINS, hasServiceChain, restoreText, rulesetPlan, staleChains, unchangedLeftOut, type Plan,
  type RestoreInput, type Ruleset,
} from './plan.ts';
import { chainLine, EMPTY_LINES, ruleTotal, sectionLines, sectionParts, tableSection, type ChainUnit } from './units.ts';

export interface FullPlanRequest {
  state: ProxyState;
  opts: IptablesOptions;
  /** nat chains believed installed; the service chains among them that are not wanted are deleted */
  installedNatChains?: ReadonlySet<string>;
  /** false leaves the stale chains installed (large-cluster mode, within syncPeriod, as upstream) */
  deleteStale?: boolean;
  /**
   * Split a payload larger than this many nat lines into restores of about this many lines,
   * each holding whole services (kproxy, not upstream; see chunkedPayloads). Unset or 0: one payload.
   */
  chunkLines?: number;
  /** the blocks rendered so far (the sync state's); none: rendered afresh */
  cache?: BlockCache;
}

/** Every service's blocks, every service's chains written. */
export function fullRuleset(state: ProxyState, opts: IptablesOptions, cache: BlockCache): Ruleset {
  return collectRuleset(state, opts, (sp, eps, ctx) => ({ block: cache.block(sp, eps, ctx, true), write: true }));
}

/** The restore payload(s) of a full sync, as text (render, the conformance goldens, dumps). */
export function planFull(req: FullPlanRequest): Plan {
  return withText(planFullStreamed(req));
}

/** A plan with its restores as text (`payload`, or `chunks` when chunked); a plan in text as it is. */
export function withText<P extends Plan>(streamed: P): P {
  const { restores, ...plan } = streamed;
  if (!restores) return streamed;
  const texts = restores.map(restoreText);
  const chunked = plan.chunks !== undefined;
  return { ...plan, payload: chunked ? '' : texts.join(''), chunks: chunked ? texts : undefined } as P;
}

/**
 * A full sync whose restores are made as iptables-restore reads them (`restores`; `payload`
 * '' and `chunks` [] when chunked, undefined otherwise): the proxier's form, which holds one
 * restore's text at a time.
 */
export function planFullStreamed(req: FullPlanRequest): Plan {
  const { state, opts } = req;
  const r = fullRuleset(state, opts, req.cache ?? new BlockCache());
  const deletedChains = staleChains(req.installedNatChains, r.active, req.deleteStale !== false);
  const chainDigests = new Map<string, string>();
  const skipped = { n: 0 };
  const filterUnits = unchangedLeftOut('filter', r.filterUnits, chainDigests, undefined, skipped);
  const natUnits = [...unchangedLeftOut('nat', r.natStaticUnits, chainDigests, undefined, skipped), ...r.written.units];
  const natRulesWritten = ruleTotal(natUnits);
  const natLines = natRulesWritten + natUnits.length + deletedChains.length * 2;
  const chunkLines = req.chunkLines ?? 0;
  const filterSection = tableSection('filter', filterUnits, []);
  let restores: RestoreInput[];
  let chunked = false;
  if (chunkLines && natLines > chunkLines) {
    // A cold start (no service chain installed, so the dispatch chains lead nowhere yet) can
    // publish each chunk's services with it; otherwise the dispatch chains are replaced at once.
    const cold = !deletedChains.length && req.installedNatChains !== undefined && !hasServiceChain(req.installedNatChains);
    restores = chunkedPayloads(r, chunkLines, filterSection, deletedChains, cold);
    chunked = true;
  } else {
    restores = [{
      lines: countLines(filterSection) + sectionLines(natUnits, deletedChains),
      parts: function* () {
        yield filterSection;
        yield* sectionParts('nat', natUnits, deletedChains);
      },
    }];
  }
  return rulesetPlan(r, req, {
    payload: '',
    natRulesWritten,
    filterRules: ruleTotal(filterUnits),
    deletedChains,
    chainDigests,
    skippedChains: 0,
    chunks: chunked ? [] : undefined,
    restores,
  });
}

/** Lines of a text whose every line ends in a newline. */
function countLines(text: string): number {
  let n = 0;
  for (let i = text.indexOf('\n'); i >= 0; i = text.indexOf('\n', i + 1)) n++;
  return n;
}

/** One chunk's nat section: `declare` declared, `units`' rules, then `tops`; made when read. */
interface ChunkSpec {
  filter: boolean;
  declare: string[];
  units: ChainUnit[];
  tops: (readonly string[])[];
}

function chunkRestore(c: ChunkSpec, filterSection: string): RestoreInput {
  let lines = 2 + c.declare.length + (c.filter ? countLines(filterSection) : 0);
  for (const u of c.units) lines += u.rules.length;
  for (const t of c.tops) lines += t.length;
  return {
    lines,
    parts: function* () {
      const out = ['*nat'];
      for (const name of c.declare) out.push(chainLine(name));
      for (const u of c.units) for (const l of u.rules) out.push(l);
      for (const t of c.tops) for (const l of t) out.push(l);
      out.push('COMMIT', '');
      yield (c.filter ? filterSection : '') + out.join('\n');
    },
  };
}

/**
 * A full sync's payload as several restores (kproxy, not upstream). iptables-nft-restore
 * --noflush is quadratic in the size of one transaction (one 10,000-service payload takes
 * minutes; see docs/benchmarks.md §1, "Rule programming vs the number of Services"), while many restores of a few
 * thousand lines each stay linear. Each chunk is its own atomic transaction that holds whole
 * services, so traffic never sees half a service:
 * 1. leaf chunks: KUBE-MARK-MASQ and KUBE-POSTROUTING first, then the services' own chains
 *    (KUBE-SVC/SVL/EXT/FW/SEP), a group of whole services per chunk; nothing jumps into a
 *    new chain yet, and an existing chain is replaced with its whole service's chains at once;
 * 2. the last chunk: the filter table, nat KUBE-SERVICES and KUBE-NODEPORTS (the dispatch
 *    rules), and the stale chains' flush and deletion (after nothing jumps to them any more).
 * --noflush semantics are kept: only the chains kproxy declares are flushed.
 *
 * `cold` (no service chain is installed, nothing to delete): the filter table goes first,
 * the first chunk also flushes KUBE-SERVICES and KUBE-NODEPORTS, each chunk appends its own
 * services' dispatch rules after their chains (so a service becomes reachable whole, in the
 * transaction that creates it), and the last chunk is the NodePort catch-all, the last rule
 * of KUBE-SERVICES. Why: iptables-nft (1.8.x) keeps the chain names a transaction mentions,
 * jump targets included, in a sorted linked list (nft-cache.c cache_chain_list_insert), so
 * one last chunk with 20,000 dispatch rules that jump to 20,000 chains costs seconds at
 * 10,000 services (docs/benchmarks.md); here each chunk's targets are the chains it declares anyway.
 * The chunks' texts are made as each restore reads them.
 */
function chunkedPayloads(r: Ruleset, maxLines: number, filterSection: string, deleted: string[], cold: boolean): RestoreInput[] {
  const chunks: RestoreInput[] = [];
  let c: ChunkSpec = { filter: cold, declare: [], units: [], tops: [] };
  let size = 0;
  const flush = () => {
    if (!size) return;
    chunks.push(chunkRestore(c, filterSection));
    c = { filter: false, declare: [], units: [], tops: [] };
    size = 0;
  };
  const add = (u: ChainUnit) => {
    if (u.declare) c.declare.push(u.name);
    c.units.push(u);
    size += (u.declare ? 1 : 0) + u.rules.length;
  };
  const dispatch: ChainUnit[] = [];
  for (const u of r.natStaticUnits) {
    if (!DISPATCH_CHAINS.has(u.name)) add(u);
    else if (!cold) dispatch.push(u);
    else if (u.declare) {
      c.declare.push(u.name);
      size++;
    }
  }
  const { units, starts } = r.written;
  for (let s = 0; s < starts.length; s++) {
    const end = s + 1 < starts.length ? starts[s + 1] : units.length;
    const own = cold ? r.written.tops[s] : EMPTY_LINES;
    let n = own.length;
    for (let i = starts[s]; i < end; i++) n += 1 + units[i].rules.length;
    if (size && size + n > maxLines) flush();
    for (let i = starts[s]; i < end; i++) add(units[i]);
    if (own.length) {
      c.tops.push(own);
      size += own.length;
    }
  }
  flush();
  if (cold) {
    if (r.natTail.length) {
      const tail = ['*nat', ...r.natTail, 'COMMIT', ''].join('\n');
      chunks.push({ lines: r.natTail.length + 2, parts: () => [tail] });
    }
    return chunks;
  }
  const last = filterSection + dispatchChunk(dispatch, deleted);
  chunks.push({ lines: countLines(last), parts: () => [last] });
  return chunks;
}

/** The last chunk's nat section: the dispatch chains rewritten, then the stale chains flushed and deleted. */
function dispatchChunk(dispatch: ChainUnit[], deleted: string[]): string {
  const last = ['*nat'];
  for (const u of dispatch) if (u.declare) last.push(chainLine(u.name));
  for (const c of deleted) last.push(chainLine(c));
  for (const u of dispatch) for (const l of u.rules) last.push(l);
  for (const c of deleted) last.push(`-X ${c}`);
  last.push('COMMIT', '');
  return last.join('\n');
}
