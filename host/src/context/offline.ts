// Context without a cluster: objects from a YAML file (a list, a `kind: List`, or several
// documents separated by ---), for `portcullis run --context` and the SDK's testing helper.
// Every granted kind counts as synced: what the file does not hold does not exist.
import { readFile } from 'node:fs/promises';
import type { JsonObject } from '@portcullis/sdk';
import { parseAllDocuments } from 'yaml';
import { ConfigError, errorMessage } from '../errors.ts';
import { kindKey, type Grant } from './grants.ts';
import type { ContextHub } from './hub.ts';
import { toEntry, type ContextEntry } from './store.ts';

export async function loadContextFile(path: string): Promise<JsonObject[]> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    throw new ConfigError(`cannot read the context file ${path}: ${errorMessage(error)}`);
  }
  return parseContextObjects(text, path);
}

export function parseContextObjects(text: string, source: string): JsonObject[] {
  const objects: JsonObject[] = [];
  const documents = parseAllDocuments(text);
  for (const [d, document] of documents.entries()) {
    if (document.errors.length > 0) {
      throw new ConfigError(`${source}: document ${d + 1} is not valid YAML: ${document.errors[0]!.message.split('\n')[0]}`);
    }
    const value: unknown = document.toJS();
    if (value === null || value === undefined) continue;
    const items = Array.isArray(value) ? value : isObject(value) && value.kind === 'List' && Array.isArray(value.items) ? value.items : [value];
    for (const [i, item] of (items as unknown[]).entries()) objects.push(checkObject(item, `${source}: document ${d + 1}, item ${i + 1}`));
  }
  return objects;
}

function checkObject(item: unknown, where: string): JsonObject {
  if (!isObject(item)) throw new ConfigError(`${where} is not an object`);
  if (typeof item.apiVersion !== 'string' || !item.apiVersion) throw new ConfigError(`${where} has no apiVersion`);
  if (typeof item.kind !== 'string' || !item.kind) throw new ConfigError(`${where} has no kind`);
  const metadata = item.metadata;
  if (!isObject(metadata) || typeof metadata.name !== 'string' || !metadata.name) {
    throw new ConfigError(`${where} (${item.kind}) has no metadata.name`);
  }
  return item as JsonObject;
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Fills a hub with the objects, every granted kind synced (empty when the file has none of it). */
export function loadOffline(hub: ContextHub, objects: readonly JsonObject[], kinds: readonly Grant[]): void {
  const byKind = new Map<string, ContextEntry[]>();
  for (const grant of kinds) byKind.set(kindKey(grant.apiVersion, grant.kind), []);
  for (const object of objects) {
    const key = kindKey(asText(object.apiVersion), asText(object.kind));
    const entry = toEntry(object);
    if (!entry) continue;
    let list = byKind.get(key);
    if (!list) byKind.set(key, (list = []));
    list.push(entry);
  }
  for (const [kind, entries] of byKind) hub.apply({ type: 'context', op: 'reset', kind, entries, synced: true });
}

function asText(value: unknown): string {
  return typeof value === 'string' ? value : JSON.stringify(value) ?? '';
}
