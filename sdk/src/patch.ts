import type { JsonObject, JsonValue, PatchOperation } from './contract.ts';

export type PathLike = string | ReadonlyArray<string | number>;

/**
 * A Kopf-style patch: say what the object should look like and the patch records the
 * RFC 6902 operations that get it there, relative to the object the policy was given.
 *
 *   patch.set('/spec/replicas', 3)            // add or replace, creating parents
 *   patch.set(['metadata', 'labels', 'a'], null)   // null deletes the key
 *   patch.merge({ metadata: { annotations: { owner: 'me' } } })   // RFC 7386 semantics
 *   patch.apply({ op: 'add', path: '/spec/x', value: 1 })          // raw RFC 6902
 *
 * Every operation is applied to a working copy as it is recorded, so later calls see earlier
 * ones (setting two keys of a new map yields one `add` and one nested `add`). The object the
 * policy was given is never changed. Change the object through the patch only: the working copy
 * shares with it what no operation has touched, so an edit made to the object directly is
 * taken as how the object came (and yields no operation).
 */
export class Patch {
  readonly operations: PatchOperation[] = [];
  /**
   * The object as patched so far. It shares what no operation touched with the object given:
   * an operation first copies the maps and lists on its way (#own). A whole copy up front cost
   * a TypeScript mutation more than its policy did (QuickJS serialized and parsed the whole
   * Pod, and with values apart parsed every one of them) to set one label.
   */
  #doc: JsonValue | undefined;
  /** The maps and lists of #doc that are its own, not shared with the object given. */
  #owned = new WeakSet<object>();

  constructor(original: JsonValue | undefined | null) {
    this.#doc = original ?? undefined;
  }

  get isEmpty(): boolean {
    return this.operations.length === 0;
  }

  /** The object as it will be once the recorded operations are applied (a copy). */
  get result(): JsonValue | undefined {
    return this.#doc === undefined ? undefined : structuredCloneJson(this.#doc);
  }

  set(path: PathLike, value: JsonValue): this {
    const segments = toSegments(path);
    if (segments.length === 0) throw new TypeError('patch.set needs a path below the object root');
    const doc = this.#doc;
    if (!isContainer(doc)) throw new TypeError('this request has no object to patch');
    let parent: JsonValue = doc;
    for (let i = 0; i < segments.length - 1; i++) {
      const child = getChild(parent, segments[i]!);
      if (!isContainer(child)) {
        if (value === null) return this; // deleting below something absent: nothing to do
        // Appending to a list that is not there: the list is added empty first (with the maps
        // missing above it), then the append is made as into a list that was there. Another
        // policy appending to the same missing list then composes with this one in the host's
        // merge (newcomer: one `add` of the whole new list conflicted with theirs).
        const list = segments.indexOf('-', i + 1);
        if (child === undefined && isPlainObject(parent) && list > i) {
          const typed = typeof path === 'string' ? undefined : path.slice(0, list);
          this.#record({ op: 'add', path: toPointer(segments.slice(0, i + 1)), value: nest(segments.slice(0, list), i + 1, [], typed) });
          return this.set(path, value);
        }
        const nested = nest(segments, i + 1, value, typeof path === 'string' ? undefined : path);
        const op = child === undefined ? 'add' : 'replace';
        return this.#record({ op, path: toPointer(segments.slice(0, i + 1)), value: nested });
      }
      parent = child;
    }
    const last = segments[segments.length - 1]!;
    const current = getChild(parent, last);
    const pointer = toPointer(segments);
    if (value === null) {
      return current === undefined ? this : this.#record({ op: 'remove', path: pointer });
    }
    if (current === undefined) return this.#record({ op: 'add', path: pointer, value });
    if (deepEqual(current, value)) return this;
    return this.#record({ op: 'replace', path: pointer, value });
  }

  remove(path: PathLike): this {
    return this.set(path, null);
  }

  /** JSON merge patch (RFC 7386): objects merge key by key, null deletes, anything else replaces. */
  merge(partial: JsonObject, base: PathLike = []): this {
    const prefix = toSegments(base);
    for (const [key, value] of Object.entries(partial)) {
      const path = [...prefix, key];
      const current = getPath(this.#doc, path);
      if (isPlainObject(value) && isPlainObject(current)) this.merge(value, path);
      // Merged into nothing (or into a non-map), a map still loses its null members (RFC 7386:
      // the target is taken as {}). Red team: `labels: { old: null, team: 'a' }` on a Pod
      // without labels added `old: null`.
      else this.set(path, isPlainObject(value) ? withoutNulls(value) : value);
    }
    return this;
  }

  /**
   * Record raw RFC 6902 operations; each must apply to the object as patched so far. One that
   * cannot apply throws a PatchError and changes nothing: those before it stay recorded.
   */
  apply(...operations: PatchOperation[]): this {
    for (const operation of operations) this.#record(operation);
    return this;
  }

  #record(given: PatchOperation): this {
    // The operation is copied, its value too: a caller that changes what it passed afterwards
    // (or passed a piece of ctx.object and edits that) must not change the patch sent.
    const operation = ownOperation(given);
    if (operation.op === 'move') this.#move(operation);
    else {
      // The parents of what it changes become the working copy's own first.
      if (operation.op !== 'test') this.#own(toSegments(operation.path).slice(0, -1));
      this.#doc = applyOperation(this.#doc, operation);
    }
    this.operations.push(operation);
    return this;
  }

  /**
   * Remove, then add where `path` points once the value is gone (RFC 6902 4.4). The parents on
   * `path` become the working copy's own only after the removal: before it, a list index on the
   * way named the element that the removal then moved there, which was still the object
   * given's (red team: a move within a list wrote into the object the policy was given).
   */
  #move(operation: { op: 'move' | 'copy'; from: string; path: string }): void {
    const from = toSegments(operation.from);
    const path = toSegments(operation.path);
    if (isInside(path, from)) fail(operation, 'cannot move a value into itself');
    const value = getPath(this.#doc, from);
    if (value === undefined) fail(operation, `"from" ${operation.from} does not exist`);
    const parentPath = from.slice(0, -1);
    this.#own(parentPath);
    const parent = getPath(this.#doc, parentPath) as JsonObject | JsonValue[];
    // To put back should the add fail: a move that cannot apply changes nothing.
    const before = shallowCopy(parent);
    this.#doc = removeAt(this.#doc, from, operation);
    this.#own(path.slice(0, -1));
    try {
      this.#doc = insert(this.#doc, path, value, operation.path, false);
    } catch (error) {
      this.#owned.add(before);
      if (parentPath.length === 0) this.#doc = before;
      else setChild(getPath(this.#doc, parentPath.slice(0, -1)) as JsonObject | JsonValue[], parentPath[parentPath.length - 1]!, before);
      throw error;
    }
  }

  /** Makes the root and the maps and lists down `segments` the working copy's own, copying each shared one. */
  #own(segments: readonly string[]): void {
    let node = this.#doc;
    if (!isContainer(node)) return;
    if (!this.#owned.has(node)) {
      node = this.#doc = shallowCopy(node);
      this.#owned.add(node);
    }
    for (const segment of segments) {
      const child = getChild(node, segment);
      // Nothing below to change: the operation creates it, or fails.
      if (!isContainer(child)) return;
      if (this.#owned.has(child)) {
        node = child;
        continue;
      }
      const copy = shallowCopy(child);
      this.#owned.add(copy);
      setChild(node, segment, copy);
      node = copy;
    }
  }
}

/**
 * A copy of one map or list, its members shared. A map's members are copied as their property
 * descriptors, so that a value apart not read yet (input.ts) is not read now; each made
 * writable and configurable, so that a frozen object given yields a working copy.
 */
function shallowCopy(node: JsonObject | JsonValue[]): JsonObject | JsonValue[] {
  if (Array.isArray(node)) return node.slice();
  const descriptors = Object.getOwnPropertyDescriptors(node);
  for (const key of Object.keys(descriptors)) {
    const descriptor = descriptors[key]!;
    descriptor.configurable = true;
    if (!descriptor.get && !descriptor.set) descriptor.writable = true;
  }
  return Object.defineProperties({}, descriptors);
}

/** As a plain assignment would, but a key such as `__proto__` is a key here, not the prototype. */
function setChild(parent: JsonObject | JsonValue[], key: string, value: JsonValue): void {
  if (Array.isArray(parent)) parent[Number(key)] = value;
  else Object.defineProperty(parent, key, { value, writable: true, enumerable: true, configurable: true });
}

export function toSegments(path: PathLike): string[] {
  if (typeof path !== 'string') return path.map(String);
  if (path === '') return [];
  if (!path.startsWith('/')) throw new TypeError(`"${path}" is not a JSON pointer (it must start with "/")`);
  return path.slice(1).split('/').map((s) => s.replace(/~1/g, '/').replace(/~0/g, '~'));
}

export function toPointer(segments: readonly string[]): string {
  return segments.map((s) => '/' + s.replace(/~/g, '~0').replace(/\//g, '~1')).join('');
}

/** Applies one operation to a document, returning the new document. Throws when it cannot apply. */
export function applyOperation(doc: JsonValue | undefined, operation: PatchOperation): JsonValue | undefined {
  const segments = toSegments(operation.path);
  switch (operation.op) {
    case 'add':
      return insert(doc, segments, clone(operation.value), operation.path, false);
    case 'replace':
      if (getPath(doc, segments) === undefined) fail(operation, 'the path does not exist');
      return insert(doc, segments, clone(operation.value), operation.path, true);
    case 'remove':
      return removeAt(doc, segments, operation);
    case 'test':
      if (!deepEqual(getPath(doc, segments), operation.value)) fail(operation, 'the value differs');
      return doc;
    case 'move':
    case 'copy': {
      const from = toSegments(operation.from);
      if (operation.op === 'move' && isInside(segments, from)) fail(operation, 'cannot move a value into itself');
      const value = getPath(doc, from);
      if (value === undefined) fail(operation, `"from" ${operation.from} does not exist`);
      const without = operation.op === 'move' ? removeAt(doc, from, operation) : doc;
      return insert(without, segments, clone(value), operation.path, false);
    }
    default:
      throw new TypeError(`unknown patch operation ${JSON.stringify((operation as { op: unknown }).op)}`);
  }
}

function insert(doc: JsonValue | undefined, segments: string[], value: JsonValue, path: string, replace: boolean): JsonValue {
  if (segments.length === 0) return value;
  const parent = getPath(doc, segments.slice(0, -1));
  const key = segments[segments.length - 1]!;
  if (Array.isArray(parent)) {
    const index = key === '-' ? parent.length : arrayIndex(key, path);
    if (index > parent.length || (replace && index >= parent.length)) throw new PatchError(path, 'index out of range');
    if (replace) parent[index] = value;
    else parent.splice(index, 0, value);
  } else if (isPlainObject(parent)) {
    setChild(parent, key, value);
  } else {
    throw new PatchError(path, 'the parent does not exist');
  }
  return doc as JsonValue;
}

function removeAt(doc: JsonValue | undefined, segments: string[], operation: PatchOperation): JsonValue | undefined {
  if (segments.length === 0) fail(operation, 'cannot remove the whole object');
  const parent = getPath(doc, segments.slice(0, -1));
  const key = segments[segments.length - 1]!;
  if (Array.isArray(parent)) {
    const index = arrayIndex(key, operation.path);
    if (index >= parent.length) fail(operation, 'index out of range');
    parent.splice(index, 1);
  } else if (isPlainObject(parent) && Object.prototype.hasOwnProperty.call(parent, key)) {
    delete parent[key];
  } else {
    fail(operation, 'the path does not exist');
  }
  return doc;
}

export class PatchError extends Error {
  readonly path: string;
  constructor(path: string, reason: string) {
    super(`cannot apply patch at ${path}: ${reason}`);
    this.name = 'PatchError';
    this.path = path;
  }
}

function fail(operation: PatchOperation, reason: string): never {
  throw new PatchError(operation.path, `${operation.op}: ${reason}`);
}

/** `path` lies strictly inside `outer` (RFC 6902 4.4: no move into the value itself). */
function isInside(path: readonly string[], outer: readonly string[]): boolean {
  return outer.length < path.length && outer.every((segment, i) => segment === path[i]);
}

function arrayIndex(key: string, path: string): number {
  if (!/^(0|[1-9][0-9]*)$/.test(key)) throw new PatchError(path, `"${key}" is not an array index`);
  return Number(key);
}

export function getPath(doc: JsonValue | undefined, segments: readonly string[]): JsonValue | undefined {
  let node = doc;
  for (const segment of segments) {
    node = getChild(node, segment);
    if (node === undefined) return undefined;
  }
  return node;
}

function getChild(node: JsonValue | undefined, key: string): JsonValue | undefined {
  if (Array.isArray(node)) return /^(0|[1-9][0-9]*)$/.test(key) ? node[Number(key)] : undefined;
  if (isPlainObject(node)) return Object.prototype.hasOwnProperty.call(node, key) ? node[key] : undefined;
  return undefined;
}

/**
 * The missing parents from `segments[from]` down, holding `value`. `-` (append) and, in a path
 * given as an array, the number 0 make a list; any other number cannot be created (a list with
 * holes). Red team: `set('/spec/containers/0/env/-', …)` without `env` wrote `env: {"-": …}`.
 * A numeric string stays a map key: a pointer cannot tell labels' "0" from a list index.
 */
function nest(segments: readonly string[], from: number, value: JsonValue, typed?: ReadonlyArray<string | number>): JsonValue {
  let result = value;
  for (let i = segments.length - 1; i >= from; i--) {
    const segment = segments[i]!;
    const index = typed?.[i];
    if (segment === '-' || index === 0) result = [result];
    else if (typeof index === 'number') {
      throw new PatchError(toPointer(segments.slice(0, i + 1)), `there is no list at ${toPointer(segments.slice(0, i)) || '/'} to hold element ${index}: a new list starts at 0 (or "-")`);
    } else result = { [segment]: result };
  }
  return result;
}

function isContainer(value: JsonValue | undefined): value is JsonObject | JsonValue[] {
  return typeof value === 'object' && value !== null;
}

export function isPlainObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

export function deepEqual(a: JsonValue | undefined, b: JsonValue | undefined): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a) !== Array.isArray(b)) return false;
  if (Array.isArray(a) && Array.isArray(b)) return a.length === b.length && a.every((v, i) => deepEqual(v, b[i]));
  const ka = Object.keys(a);
  const kb = Object.keys(b);
  // Own keys only: b's "__proto__" read through the prototype is Object.prototype, which equals {} (red team).
  return ka.length === kb.length && ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && deepEqual((a as JsonObject)[k], (b as JsonObject)[k]));
}

/** A map as RFC 7386 merges it into nothing: null members gone, at every level of maps (lists are values). */
function withoutNulls(value: JsonObject): JsonObject {
  const out: JsonObject = {};
  for (const [key, member] of Object.entries(value)) {
    if (member === null) continue;
    setChild(out, key, isPlainObject(member) ? withoutNulls(member) : member);
  }
  return out;
}

/**
 * A copy of an operation with only its own fields, its value cloned, checked for what the
 * types say (a policy in plain JavaScript may pass anything).
 */
function ownOperation(operation: PatchOperation): PatchOperation {
  if (!isPlainObject(operation)) throw new TypeError(`a patch operation must be an object, not ${JSON.stringify(operation)}`);
  const { op, path } = operation;
  if (typeof path !== 'string') throw new TypeError(`patch operation ${JSON.stringify(op)} needs a string "path"`);
  switch (op) {
    case 'add':
    case 'replace':
    case 'test':
      if (!('value' in operation) || operation.value === undefined) throw new TypeError(`patch operation "${op}" at ${path} needs a "value"`);
      return { op, path, value: clone(operation.value) };
    case 'remove':
      return { op, path };
    case 'move':
    case 'copy':
      if (typeof operation.from !== 'string') throw new TypeError(`patch operation "${op}" at ${path} needs a string "from"`);
      return { op, from: operation.from, path };
    default:
      throw new TypeError(`unknown patch operation ${JSON.stringify(op)}`);
  }
}

function clone(value: JsonValue): JsonValue {
  return isContainer(value) ? structuredCloneJson(value) : value;
}

function structuredCloneJson<T extends JsonValue>(value: T): T {
  return JSON.parse(JSON.stringify(value)) as T;
}
