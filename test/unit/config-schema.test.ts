// config.schema.json is the one description of the configuration: these tests hold the
// TypeScript types and the defaults to it, so a field added to one and not the other fails here.
import { readFileSync } from 'node:fs';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../../host/src/config/load.ts';
import { DEFAULT_LIMITS } from '../../host/src/config/limits.ts';
import { schemaAt, type JsonSchema } from '../../host/src/config/schema.ts';
import { root } from '../helpers/policies.ts';

/** Each `Raw*` interface of config/types.ts: member name -> optional? */
function rawInterfaces(): Map<string, Map<string, boolean>> {
  const file = `${root}host/src/config/types.ts`;
  const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest);
  const found = new Map<string, Map<string, boolean>>();
  source.forEachChild((node) => {
    if (!ts.isInterfaceDeclaration(node) || !node.name.text.startsWith('Raw')) return;
    const members = new Map<string, boolean>();
    for (const member of node.members) {
      if (ts.isPropertySignature(member) && ts.isIdentifier(member.name)) members.set(member.name.text, member.questionToken !== undefined);
    }
    found.set(node.name.text, members);
  });
  return found;
}

const RAW_TO_SCHEMA: Record<string, string[]> = {
  RawConfig: [], RawServer: ['server'], RawTls: ['server', 'tls'], RawDefaults: ['defaults'],
  RawPolicy: ['policies'], RawWebhooks: ['webhooks'], RawRegistries: ['registries'], RawCache: ['cache'],
};

describe('config.schema.json and config/types.ts', () => {
  const raw = rawInterfaces();

  it('every Raw* interface is checked here', () => {
    expect([...raw.keys()].sort()).toEqual(Object.keys(RAW_TO_SCHEMA).sort());
  });

  it.each(Object.entries(RAW_TO_SCHEMA))('%s has exactly the fields of the schema, optional where the schema does not require them', (name, path) => {
    const object: JsonSchema = path.length === 0 ? schemaAt() : schemaAt(...path);
    const members = raw.get(name)!;
    expect([...members.keys()].sort()).toEqual(Object.keys(object.properties ?? {}).sort());
    const required = new Set(object.required ?? []);
    for (const [field, optional] of members) expect({ field, optional }).toEqual({ field, optional: !required.has(field) });
  });

  it('a file with only policies gets every default from the schema, and no field is left undefined', () => {
    const config = parseConfig('policies: [{ name: p, module: p.wasm }]', '/etc/portcullis.yaml');
    const undefinedIn = (object: object) => Object.entries(object).filter(([, v]) => v === undefined).map(([k]) => k);
    expect(undefinedIn(config.server)).toEqual([]);
    expect(undefinedIn(config.webhooks)).toEqual([]);
    expect(config.server).toMatchObject({ host: schemaAt('server', 'host').default, port: schemaAt('server', 'port').default, maxBodyBytes: schemaAt('server', 'maxBodyBytes').default });
    expect(config.webhooks).toMatchObject({
      timeoutSeconds: 10, excludeNamespaces: [], leaderElection: true, leaseDurationSeconds: 15, resyncSeconds: 60, singleWebhook: false,
    });
    expect(config.policies[0]).toMatchObject({ limits: DEFAULT_LIMITS, failurePolicy: 'Fail', enforcement: 'enforce', isolation: 'reuse', persistent: false, sideEffects: 'None' });
    // Every required field of the normalized server and webhooks sections has a schema default.
    for (const [section, optional] of [['server', ['tls', 'metricsPort']], ['webhooks', ['managed', 'url', 'service', 'namespace']]] as const) {
      const properties = Object.keys(schemaAt(section).properties ?? {}).filter((f) => !(optional as readonly string[]).includes(f));
      for (const field of properties) {
        expect({ section, field, default: schemaAt(section, field).default !== undefined }).toEqual({ section, field, default: true });
      }
    }
  });

  it('the limits a policy gets by default are the schema\'s', () => {
    expect(DEFAULT_LIMITS).toEqual({ timeoutMs: 2000, memoryMiB: 64, maxOutputBytes: 1048576, maxModuleMiB: 32 });
  });
});
