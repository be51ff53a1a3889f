// The layers of DESIGN.md, checked on every file of src/, type imports included
// (`npm run depcheck`, and test/layering.test.ts in the test suite). Top to bottom:
//   cli → sync, server → proxy (a mode's host side) → sources, exec, dataplane, the iptables
//   executor → modes (pure planners and tracers) → the kernel tools' pure models (kernel/*/model,
//   the iptables text tools) → core → config → errors, log
// An import never runs back up, and no two files import each other, however indirectly.
const PURE = '^src/(core|modes)/|^src/config/(config|feature-gates)\\.ts$|^src/kernel/[^/]+/model\\.ts$|^src/iptables/(tokenize|save|parse)\\.ts$|^src/errors\\.ts$';
const HOST = '^src/(exec|dataplane|sources|proxy|server|sync|cli)/|^src/iptables/(exec|fake|cleanup|ownership)\\.ts$';

/** `from` may not import anything matching `to`: a rule per arrow that would run back up. */
const below = (name, from, to, comment) => ({ name, severity: 'error', comment, from: { path: from }, to: { path: to } });

module.exports = {
  forbidden: [
    { name: 'no-circular', severity: 'error', comment: 'no two files import each other, however indirectly', from: {}, to: { circular: true } },
    below('pure-reaches-host', PURE, HOST, 'planners, tracers, the node view and config are pure: they never reach host code'),
    {
      name: 'pure-uses-io',
      severity: 'error',
      comment: 'pure code does no I/O: no processes, files, sockets or loggers',
      from: { path: PURE },
      to: { dependencyTypes: ['core', 'npm'], path: '^(node:)?(fs|fs/promises|child_process|net|dgram|http|https|http2|tls|cluster|worker_threads)$|pino|@kubernetes/client-node' },
    },
    below('core-reaches-modes', '^src/core/', '^src/(modes|iptables|kernel)/', 'the node view decides; modes only express it'),
    below('model-reaches-modes', '^src/kernel/[^/]+/model\\.ts$|^src/iptables/', '^src/modes/', 'a kernel tool describes its own objects; it knows no mode'),
    below('config-reaches-up', '^src/config/', '^src/(modes|iptables|kernel)/|^src/core/(?!ip\\.ts$)', 'the configuration sits under everything but the IP helpers'),
    below('modes-reach-sync', '^src/(proxy|sources|exec|dataplane|iptables)/', '^src/(sync|server|cli)/', 'a mode never reaches the loop, the servers or the command line'),
    below('sync-reaches-cli', '^src/(sync|server)/', '^src/cli/', 'the command line is the top layer'),
    {
      name: 'process-outside-exec',
      severity: 'error',
      comment: 'processes start only in src/exec (runner.ts: argument arrays, time limits, process groups)',
      from: { pathNot: '^src/exec/' },
      to: { dependencyTypes: ['core'], dependencyTypesNot: ['type-only'], path: '^(node:)?child_process$' },
    },
    below('exec-reaches-modes', '^src/exec/', '^src/(modes|proxy)/', 'a kernel tool reads and writes its own objects; it knows no mode'),
  ],
  options: {
    tsPreCompilationDeps: true,
    doNotFollow: { path: 'node_modules' },
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
