// Import layers of the host, in the order a review flows through it: a folder may import only
// folders below it in LAYERS (and itself); nothing may form a cycle. `npm run lint` runs this
// and names both files of a violation.
//   cli       commands (serve, build, run, ...)
//   server    HTTP, TLS, the review pipeline, telemetry
//   webhooks, certs   what the host manages in the cluster
//   review, select, merge   parse and answer reviews, pick policies, combine outcomes
//   evaluate  one policy on one request
//   policy    load policies (modules + settings + metadata)
//   sandbox, oci, cache   run Wasm in isolation; fetch modules from registries; keep their on-disk cache in bounds
//   context   the cluster objects policies may read (cache, grants, reads)
//   config    the configuration's types, schema defaults and selector semantics
//   util      logging, digests, cache paths
const LAYERS = [
  'cli',
  'server',
  'webhooks|certs',
  'review|select|merge',
  'evaluate',
  'policy',
  'sandbox|oci|cache',
  'context',
  'config',
  'util',
];
const folder = (names) => `^host/src/(${names})/`;
const forbidden = LAYERS.map((names, i) => ({
  name: `layer-${names.replace(/\|/g, '-')}`,
  comment: `host/src/{${names}} may not import a higher layer (${LAYERS.slice(0, i).join(', ') || 'none'})`,
  severity: 'error',
  from: { path: folder(names) },
  to: { path: i === 0 ? '^$' : folder(LAYERS.slice(0, i).join('|')) },
})).filter((rule) => rule.to.path !== '^$');

module.exports = {
  forbidden: [
    { name: 'no-circular', severity: 'error', comment: 'import cycles hide which module owns what', from: {}, to: { circular: true } },
    {
      name: 'errors-at-the-bottom', severity: 'error', comment: 'host/src/errors.ts is imported by every layer, so it imports none of them',
      from: { path: '^host/src/errors\\.ts$' }, to: { path: '^host/src/[a-z]+/' },
    },
    {
      name: 'every-folder-has-a-layer', severity: 'error', comment: 'a new folder under host/src must be given its place in LAYERS',
      from: { path: '^host/src/[a-z-]+/', pathNot: `^host/src/(${LAYERS.join('|')})/` }, to: {},
    },
    ...forbidden,
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
