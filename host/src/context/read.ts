// Answers one context read from a guest, synchronously, from a ContextStore. The request is
// untrusted guest output: it is validated here, checked against the policy's grants, and the
// answer is capped in size before it is built, so a policy listing 10,000 objects gets a clear
// error instead of taking the worker's memory.
import type { JsonObject } from '@portcullis/sdk';
import type { LabelSelector } from '../config/types.ts';
import { fieldSelectorMatches, labelSelectorMatches } from '../config/selectors.ts';
import { ContextError, isGranted, notGranted, type Grant } from './grants.ts';
import { parseLabelSelector, SelectorSyntaxError } from './selectors.ts';
import type { ContextEntry, ContextStore } from './store.ts';

/** What a guest may ask (the JSON text of `portcullis:policy/context.read`). */
export type ContextRequest =
  | { verb: 'get'; apiVersion: string; kind: string; namespace: string; name: string }
  | { verb: 'list'; apiVersion: string; kind: string; namespace?: string; labelSelector?: string; fieldSelector?: string };

/** Largest answer one read may return, unless the policy's memory cap is smaller (a quarter of it). */
export const MAX_CONTEXT_READ_BYTES = 4 * 2 ** 20;

export interface ReadScope {
  policy: string;
  grants: readonly Grant[];
  /** Bytes one answer may take. */
  maxBytes: number;
}

export function readLimit(memoryCapBytes: number): number {
  return Math.min(MAX_CONTEXT_READ_BYTES, Math.floor(memoryCapBytes / 4));
}

/**
 * The JSON text the guest receives: `{"object": {...} | null}` for get, `{"items": [...]}` for
 * list, or `{"error": {"kind": "permanent" | "temporary", "code", "message"}}`. Never throws.
 */
export function answerRead(store: ContextStore, scope: ReadScope, requestText: string): string {
  try {
    return read(store, scope, recentRequest(scope.policy, requestText));
  } catch (error) {
    if (!(error instanceof ContextError)) throw error;
    return JSON.stringify({ error: { kind: error.kind, code: error.code, message: error.message } });
  }
}

// Policies repeat their requests (the review's namespace, the same kinds): a request the worker
// has parsed lately is not parsed and checked again (~1.5 µs of a 10 µs get). Only valid ones are
// kept, only short ones, and at most RECENT_REQUESTS: bounded whatever a guest sends.
const recent = new Map<string, ContextRequest>();
const RECENT_REQUESTS = 256;
const RECENT_REQUEST_LENGTH = 512;

function recentRequest(policy: string, text: string): ContextRequest {
  let request = recent.get(text);
  if (request === undefined) {
    request = parseRequest(policy, text);
    if (text.length <= RECENT_REQUEST_LENGTH) {
      if (recent.size >= RECENT_REQUESTS) recent.clear();
      recent.set(text, request);
    }
  }
  return request;
}

function read(store: ContextStore, scope: ReadScope, request: ContextRequest): string {
  const { apiVersion, kind } = request;
  if (!isGranted(scope.grants, apiVersion, kind)) throw notGranted(scope.policy, scope.grants, apiVersion, kind);
  const synced = store.synced(apiVersion, kind);
  if (synced !== true) {
    throw new ContextError('CONTEXT_NOT_SYNCED', `the host's cache of ${kind} (${apiVersion}) has not synced with the cluster yet; retry shortly`);
  }
  if (request.verb === 'get') {
    const entry = store.get(apiVersion, kind, request.namespace, request.name);
    if (entry && entry.bytes > scope.maxBytes) throw tooLarge(scope, request, entry.bytes);
    return entry ? `{"object":${entry.json}}` : '{"object":null}';
  }
  const labels: LabelSelector | undefined = request.labelSelector ? parseLabelSelector(request.labelSelector) : undefined;
  const fieldsOf = request.fieldSelector && onlyMetadataFields(request.fieldSelector) ? metadataOnly : parsed;
  const parts: string[] = [];
  let size = 12;
  for (const entry of store.entries(apiVersion, kind, request.namespace)) {
    if (labels && !labelSelectorMatches(labels, entry.labels)) continue;
    if (request.fieldSelector && !fieldSelectorMatches(request.fieldSelector, fieldsOf(entry))) continue;
    // Counted before the answer grows: the host never builds more than the limit.
    size += entry.bytes + 1;
    if (size > scope.maxBytes) throw tooLarge(scope, request, size);
    parts.push(entry.json);
  }
  return `{"items":[${parts.join(',')}]}`;
}

/** Field selectors on metadata.name/namespace need no parsing of the object; anything else does. */
function onlyMetadataFields(selector: string): boolean {
  return selector.split(',').every((term) => term.trim() === '' || /^\s*metadata\.(name|namespace)\s*(==|!=|=)/.test(term));
}

function metadataOnly(entry: ContextEntry): JsonObject {
  return { metadata: { name: entry.name, namespace: entry.namespace } };
}

function parsed(entry: ContextEntry): JsonObject {
  return JSON.parse(entry.json) as JsonObject;
}

function tooLarge(scope: ReadScope, request: ContextRequest, size: number): ContextError {
  const what = request.verb === 'get' ? `get of ${request.kind} ${request.namespace}/${request.name}` : `list of ${request.kind}`;
  return new ContextError(
    'CONTEXT_TOO_LARGE',
    `the ${what} (${request.apiVersion}) exceeds the ${scope.maxBytes}-byte limit of one context read (at ${size} bytes); ` +
    'narrow it with namespace, labelSelector or fieldSelector',
  );
}

/** Longest request text a guest may send (UTF-16 units, as JSON.parse sees it). */
export const MAX_REQUEST_BYTES = 16 * 1024;
/**
 * Bytes of a guest's request worth decoding: the longest text taken, 3 bytes a character, and one
 * more. A longer request is still refused, without decoding megabytes first.
 */
export const MAX_REQUEST_DECODE_BYTES = 3 * MAX_REQUEST_BYTES + 1;
const REQUEST_FIELDS = new Set(['verb', 'apiVersion', 'kind', 'namespace', 'name', 'labelSelector', 'fieldSelector']);

/** Validates the guest's request: every field typed, nothing unknown, sizes bounded. */
export function parseRequest(policy: string, text: string): ContextRequest {
  const bad = (why: string) => new ContextError('CONTEXT_BAD_REQUEST', `policy "${policy}" made a context read the host cannot use: ${why}`);
  if (typeof text !== 'string' || text.length > MAX_REQUEST_BYTES) throw bad(`the request must be JSON text of at most ${MAX_REQUEST_BYTES} bytes`);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw bad('the request is not JSON');
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw bad('the request is not a JSON object');
  const fields = value as Record<string, unknown>;
  for (const key of Object.keys(fields)) if (!REQUEST_FIELDS.has(key)) throw bad(`unknown field "${key}"`);
  const text_ = (key: string, required: boolean): string | undefined => {
    const v = fields[key];
    if (v === undefined || v === null) {
      if (required) throw bad(`"${key}" is required`);
      return undefined;
    }
    if (typeof v !== 'string') throw bad(`"${key}" must be a string`);
    if (required && v === '') throw bad(`"${key}" must not be empty`);
    return v;
  };
  const verb = text_('verb', true);
  const apiVersion = text_('apiVersion', true)!;
  const kind = text_('kind', true)!;
  const namespace = text_('namespace', false);
  if (verb === 'get') {
    if (fields.labelSelector !== undefined || fields.fieldSelector !== undefined) throw bad('get takes no selectors; use list');
    return { verb, apiVersion, kind, namespace: namespace ?? '', name: text_('name', true)! };
  }
  if (verb !== 'list') throw bad(`"verb" must be "get" or "list", not ${JSON.stringify(verb)}`);
  if (fields.name !== undefined) throw bad('list takes no name; use get, or a fieldSelector metadata.name=…');
  const labelSelector = text_('labelSelector', false);
  const fieldSelector = text_('fieldSelector', false);
  if (labelSelector) {
    try {
      parseLabelSelector(labelSelector);
    } catch (error) {
      if (error instanceof SelectorSyntaxError) throw bad(error.message);
      throw error;
    }
  }
  if (fieldSelector && !fieldSelector.split(',').every((t) => t.trim() === '' || /^[^!=]+?\s*(==|!=|=)/.test(t))) {
    throw bad(`cannot read the field selector "${fieldSelector}" (expected path=value, path==value or path!=value terms)`);
  }
  return {
    verb, apiVersion, kind,
    ...(namespace ? { namespace } : {}), ...(labelSelector ? { labelSelector } : {}), ...(fieldSelector ? { fieldSelector } : {}),
  };
}
