// The layers of DESIGN.md, checked on every file of src/, type imports included
// (`npm run depcheck`, and test/layering.test.ts in the test suite). Top to bottom:
//   cli → sync, server → a mode's host side (modes/<mode>/index, proxier, cleanup, the userspace
//   data plane and the nftables mode's localhost NodePort listeners; modes/registry) → sources, kernel (the tools' executors) → a mode's planner and
//   tracer (pure) → the kernel tools' pure models (kernel/<tool>/model, the iptables text tools)
//   → core → config → errors, log
// An import never runs back up, and no two files import each other, however indirectly.

/** A mode's host side: what applies a plan to the kernel, or forwards packets itself. */
const MODE_HOST = '^src/modes/([^/]+/(index|proxier|table|cleanup)\\.ts$|userspace/dataplane/|nftables/localhost-nodeports\\.ts$|(registry|types|skipped-vips)\\.ts$)';
/** A kernel tool's pure part: its objects and their text forms. */
const KERNEL_MODEL = '^src/kernel/([^/]+/model|iptables/(tokenize|save|parse))\\.ts$';
const PURE_PATHS = `^src/(core|modes)/|^src/config/(config|feature-gates)\\.ts$|${KERNEL_MODEL}|^src/errors\\.ts$`;
/** Everything that touches the host or runs the process. */
const HOST = `^src/(kernel|sources|server|sync|cli)/|${MODE_HOST}`;

const PURE = { path: PURE_PATHS, pathNot: MODE_HOST };
const PURE_TARGET_OK = { pathNot: KERNEL_MODEL };

/** `from` may not import anything matching `to`: a rule per arrow that would run back up. */
const rule = (name, from, to, comment) => ({ name, severity: 'error', comment, from, to });

module.exports = {
  forbidden: [
    { name: 'no-circular', severity: 'error', comment: 'no two files import each other, however indirectly', from: {}, to: { circular: true } },
    rule('pure-reaches-host', PURE, { path: HOST, ...PURE_TARGET_OK }, 'planners, tracers, the node view, the kernel models and config are pure: they never reach host code'),
    rule(
      'pure-uses-io',
      PURE,
      { dependencyTypes: ['core', 'npm'], path: '^(node:)?(fs|fs/promises|child_process|net|dgram|http|https|http2|tls|cluster|worker_threads)$|pino|@kubernetes/client-node' },
      'pure code does no I/O: no processes, files, sockets or loggers',
    ),
    rule('core-reaches-modes', { path: '^src/core/' }, { path: '^src/(modes|kernel)/' }, 'the node view decides; modes only express it'),
    rule('model-reaches-modes', { path: KERNEL_MODEL }, { path: '^src/modes/' }, 'a kernel tool describes its own objects; it knows no mode'),
    rule('config-reaches-up', { path: '^src/config/' }, { path: '^src/(modes|kernel)/|^src/core/(?!ip\\.ts$)' }, 'the configuration sits under everything but the IP helpers'),
    rule('kernel-reaches-modes', { path: '^src/kernel/' }, { path: '^src/modes/' }, 'a kernel tool reads and writes its own objects; it knows no mode'),
    rule('modes-reach-sync', { path: '^src/(modes|kernel|sources)/' }, { path: '^src/(sync|server|cli)/' }, 'a mode never reaches the loop, the servers or the command line'),
    rule('sync-reaches-cli', { path: '^src/(sync|server)/' }, { path: '^src/cli/' }, 'the command line is the top layer'),
    rule(
      'process-outside-kernel',
      { pathNot: '^src/kernel/' },
      { dependencyTypes: ['core'], dependencyTypesNot: ['type-only'], path: '^(node:)?child_process$' },
      'processes start only in src/kernel (runner.ts: argument arrays, time limits, process groups)',
    ),
  ],
  options: {
    tsPreCompilationDeps: true,
    doNotFollow: { path: 'node_modules' },
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
