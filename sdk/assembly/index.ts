// The Portcullis SDK for AssemblyScript policies (core modules run through Extism).
//
//   import { Context, Result, handleValidate } from '@portcullis/sdk/assembly';
//   function check(ctx: Context): Result { return Result.allow(); }
//   export function validate(): i32 { return handleValidate(check); }
//
// A module exports `validate`, `mutate` and/or `validate_settings`; the host reads which from
// the module's exports. Build with `npx --no -- portcullis build assembly/index.ts -o policy.wasm`.
import { Host, LogLevel } from '@extism/as-pdk';
import { JSON } from 'json-as';

export { JSON };

/** A policy's answer. Warnings go on the context (`ctx.warn`), so they survive a denial. */
export class Result {
  constructor(
    public outcome: string,
    public message: string = '',
    public code: i32 = 0,
    public kind: string = '',
  ) {}
  static allow(): Result { return new Result('allow'); }
  /** Deny on purpose; the user sees the message. */
  static deny(message: string, code: i32 = 403): Result { return new Result('deny', message, code); }
  /** The policy cannot decide and retrying will not help (e.g. bad settings). */
  static fail(message: string): Result { return new Result('error', message, 0, 'permanent'); }
  /** The policy cannot decide now; a retry may succeed. */
  static retry(message: string): Result { return new Result('error', message, 0, 'temporary'); }
}

/**
 * Records RFC 6902 operations while keeping `ctx.object` up to date, so that two writes
 * under a parent that did not exist yield one `add` of the parent and one of the child.
 */
export class Patch {
  ops: string[] = [];
  constructor(private object: JSON.Obj | null) {}

  /**
   * Sets a value at a path of keys, creating missing parent maps: any type json-as encodes
   * (string, numbers, bool, arrays, @json classes). Named as in the TypeScript SDK.
   */
  set<T>(path: string[], value: T): void {
    this.setRaw(path, JSON.stringify<T>(value));
  }

  /** Sets a string at a path of keys (kept for older policies; set<string> does the same). */
  setString(path: string[], value: string): void {
    this.setRaw(path, JSON.stringify<string>(value));
  }

  /**
   * RFC 7386 merge patch, given as JSON text, under `base`: objects merge key by key, null
   * removes, anything else replaces. Named as in the TypeScript SDK.
   */
  merge(json: string, base: string[] = []): void {
    const partial = JSON.parse<JSON.Obj>(json);
    const keys = partial.keys();
    for (let i = 0; i < keys.length; i++) {
      const path = base.concat([keys[i]]);
      const value = partial.get(keys[i]);
      if (value == null || value.type == JSON.Types.Null) this.remove(path);
      else if (value.type == JSON.Types.Object) this.merge(JSON.stringify(value.get<JSON.Obj>()), path);
      else this.setRaw(path, JSON.stringify(value));
    }
  }

  /** Adds a raw RFC 6902 operation, as JSON text; the host checks that it applies. As `patch.apply` in TypeScript. */
  apply(operationJson: string): void { this.ops.push(operationJson); }

  /**
   * Sets any JSON value (given as JSON text) at a path, creating missing parents: maps, or a
   * list for `-` (append). A segment under a list is an index of it (or `-` to append last).
   * Walks with getAs, which keeps what it parses: json-as's get() hands back a detached copy,
   * so two writes under a map this patch created lost the first (outside author), and a path
   * through a list replaced the whole list with a map keyed "0".
   */
  setRaw(path: string[], json: string): void {
    let obj = this.object;
    if (obj == null) throw new Error('this request has no object to patch');
    let arr: JSON.Arr | null = null;
    for (let i = 0; i < path.length - 1; i++) {
      const key = path[i];
      let child: JSON.Value | null = null;
      let index: i32 = -1;
      if (arr != null) {
        index = listIndex(path, i, arr.length);
        // Past the end (`-`): the rest of the path is appended as a new element.
        if (index < arr.length) child = arr.at(index);
      } else child = obj!.get(key);
      if (child == null || (child.type != JSON.Types.Object && child.type != JSON.Types.Array)) {
        // Appending to a list that is not there: the list is added empty first (with the maps
        // missing above it), then the append is made as into a list that was there, so that
        // another policy's append to the same missing list composes with this one (as the
        // TypeScript SDK does).
        const list = path.indexOf('-', i + 1);
        if (child == null && arr == null && list > i) {
          const empty = nested(path.slice(0, list), i + 1, '[]');
          this.ops.push(op('add', pointer(path, i + 1), empty));
          setParsed(obj!, key, empty);
          this.setRaw(path, json);
          return;
        }
        const value = nested(path, i + 1, json);
        this.ops.push(op(child == null ? 'add' : 'replace', pointer(path, i + 1), value));
        if (arr != null) putParsed(arr, index, value);
        else setParsed(obj!, key, value);
        return;
      }
      if (child.type == JSON.Types.Object) {
        obj = arr != null ? arr.getAs<JSON.Obj>(index) : obj!.getAs<JSON.Obj>(key);
        arr = null;
      } else {
        arr = arr != null ? arr.getAs<JSON.Arr>(index) : obj!.getAs<JSON.Arr>(key);
        obj = null;
      }
    }
    const last = path[path.length - 1];
    const at = pointer(path, path.length);
    if (arr != null) {
      const index = listIndex(path, path.length - 1, arr.length);
      this.ops.push(op(index == arr.length ? 'add' : 'replace', at, json));
      putParsed(arr, index, json);
      return;
    }
    this.ops.push(op(obj!.has(last) ? 'replace' : 'add', at, json));
    setParsed(obj!, last, json);
  }

  remove(path: string[]): void {
    let node = this.object;
    for (let i = 0; i < path.length - 1; i++) {
      if (node == null) return;
      const child = node.get(path[i]);
      if (child == null || child.type != JSON.Types.Object) return;
      node = node.getAs<JSON.Obj>(path[i]);
    }
    if (node == null || !node.has(path[path.length - 1])) return;
    node.delete(path[path.length - 1]);
    this.ops.push('{"op":"remove","path":' + JSON.stringify<string>(pointer(path, path.length)) + '}');
  }

  /** Same as apply (kept for older policies). */
  raw(operationJson: string): void { this.ops.push(operationJson); }
}

/** The missing parents from path[from] down, as JSON text holding `json`: maps, or a list for `-`. */
function nested(path: string[], from: i32, json: string): string {
  let out = json;
  for (let j = path.length - 1; j >= from; j--) {
    out = path[j] == '-' ? '[' + out + ']' : '{' + JSON.stringify<string>(path[j]) + ':' + out + '}';
  }
  return out;
}

/** path[i] as an index of a list of `length` elements (`-` or `length` itself: append); aborts, naming the path, when it is neither. */
function listIndex(path: string[], i: i32, length: i32): i32 {
  const key = path[i];
  if (key == '-') return length;
  let value: i32 = 0;
  let ok = key.length > 0 && key.length < 10 && !(key.length > 1 && key.charCodeAt(0) == 48);
  for (let k = 0; ok && k < key.length; k++) {
    const c = key.charCodeAt(k);
    if (c < 48 || c > 57) ok = false;
    else value = value * 10 + (c - 48);
  }
  if (!ok || value > length) {
    throw new Error('patch: ' + pointer(path, i + 1) + ' is not in the list at ' + pointer(path, i) + ' (' + length.toString() + ' elements; use an index below that, or "-" to append)');
  }
  return value;
}

// Kept parsed, so that later writes under them land in the same maps and lists.
function setParsed(obj: JSON.Obj, key: string, json: string): void {
  const c = json.charCodeAt(0);
  if (c == 123) obj.set<JSON.Obj>(key, JSON.parse<JSON.Obj>(json));
  else if (c == 91) obj.set<JSON.Arr>(key, JSON.parse<JSON.Arr>(json));
  else obj.set<JSON.Raw>(key, new JSON.Raw(json));
}

/** At `index` of the list, or appended when it is the list's length. */
function putParsed(arr: JSON.Arr, index: i32, json: string): void {
  if (index == arr.length) arr.push<JSON.Raw>(new JSON.Raw('null'));
  const c = json.charCodeAt(0);
  if (c == 123) arr.set<JSON.Obj>(index, JSON.parse<JSON.Obj>(json));
  else if (c == 91) arr.set<JSON.Arr>(index, JSON.parse<JSON.Arr>(json));
  else arr.set<JSON.Raw>(index, new JSON.Raw(json));
}

function op(name: string, path: string, json: string): string {
  return '{"op":"' + name + '","path":' + JSON.stringify<string>(path) + ',"value":' + json + '}';
}

function pointer(path: string[], count: i32): string {
  let out = '';
  for (let i = 0; i < count; i++) out += '/' + path[i].replaceAll('~', '~0').replaceAll('/', '~1');
  return out;
}

export class Context {
  request: JSON.Obj = new JSON.Obj();
  settings: JSON.Obj = new JSON.Obj();
  headers: JSON.Obj = new JSON.Obj();
  sslpeer: JSON.Obj | null = null;
  operation: string = '';
  dryRun: bool = false;
  webhook: string = '';
  warnings: string[] = [];
  // The object and oldObject are most of the input. The JSON parser leaves nested values as
  // unparsed slices until they are read, so a policy that never reads them (say, one that looks
  // only at the operation or the user) does not pay to parse them (issue 14).
  private _object: JSON.Obj | null = null;
  private _objectRead: bool = false;
  private _oldObject: JSON.Obj | null = null;
  private _oldObjectRead: bool = false;
  private _patch: Patch | null = null;

  constructor(input: JSON.Obj) {
    this.request = objectAt(input, 'request') || new JSON.Obj();
    this.settings = objectAt(input, 'settings') || new JSON.Obj();
    this.headers = objectAt(input, 'headers') || new JSON.Obj();
    this.sslpeer = objectAt(input, 'sslpeer');
    this.operation = stringAt(this.request, 'operation') || '';
    this.dryRun = input.has('dryRun') && input.getAs<bool>('dryRun');
    this.webhook = stringAt(input, 'webhook') || '';
  }

  /** `request.object`: the object as it will be stored (null for DELETE and CONNECT). */
  get object(): JSON.Obj | null {
    if (!this._objectRead) {
      this._object = objectAt(this.request, 'object');
      this._objectRead = true;
    }
    return this._object;
  }

  /** `request.oldObject`: the object as it is stored now (UPDATE and DELETE). */
  get oldObject(): JSON.Obj | null {
    if (!this._oldObjectRead) {
      this._oldObject = objectAt(this.request, 'oldObject');
      this._oldObjectRead = true;
    }
    return this._oldObject;
  }

  /** The changes of a mutating policy; it keeps `object` up to date as it records them. */
  get patch(): Patch {
    if (this._patch == null) this._patch = new Patch(this.object);
    return this._patch!;
  }

  /** Whether the policy recorded any patch operation. */
  get patched(): bool {
    return this._patch != null && this._patch!.ops.length > 0;
  }

  warn(message: string): void { this.warnings.push(message); }

  /** A label of the object (or of oldObject, for DELETE), or null. */
  label(key: string): string | null {
    const source = this.object != null ? this.object : this.oldObject;
    return lookupString(source, ['metadata', 'labels', key]);
  }

  /** `request.namespace`: empty for cluster-scoped objects. */
  get namespace(): string {
    const value = stringAt(this.request, 'namespace');
    return value != null ? value : '';
  }

  /** `request.name`: empty when the apiserver names the object (generateName). */
  get name(): string {
    const value = stringAt(this.request, 'name');
    return value != null ? value : '';
  }

  /** `request.userInfo.username`: who makes the request. */
  get username(): string {
    const value = lookupString(this.request, ['userInfo', 'username']);
    return value != null ? value : '';
  }

  /** `request.userInfo.groups`: the groups of who makes the request (empty when none). */
  get groups(): string[] {
    const userInfo = objectAt(this.request, 'userInfo');
    return userInfo != null ? stringsAt(userInfo, 'groups') : [];
  }
}

/** The string at a path of keys, or null when absent or not a string. */
export function lookupString(root: JSON.Obj | null, path: string[]): string | null {
  let node = root;
  for (let i = 0; i < path.length - 1; i++) {
    if (node == null) return null;
    node = objectAt(node, path[i]);
  }
  return node == null ? null : stringAt(node, path[path.length - 1]);
}

export function objectAt(obj: JSON.Obj, key: string): JSON.Obj | null {
  const value = obj.get(key);
  if (value == null || value.type != JSON.Types.Object) return null;
  return value.get<JSON.Obj>();
}

export function stringAt(obj: JSON.Obj, key: string): string | null {
  const value = obj.get(key);
  if (value == null || value.type != JSON.Types.String) return null;
  return value.get<string>();
}

/**
 * The number at `key`, or NaN when absent or not a number (outsider: reading `spec.replicas`
 * took json-as internals). An integer prints as one with `i64(n).toString()`: an f64's own
 * toString writes `5.0`.
 */
export function numberAt(obj: JSON.Obj, key: string): f64 {
  const value = obj.get(key);
  if (value == null) return NaN;
  const type = value.type;
  if (type == JSON.Types.F64) return value.get<f64>();
  if (type == JSON.Types.F32) return <f64>value.get<f32>();
  if (type == JSON.Types.I64) return <f64>value.get<i64>();
  if (type == JSON.Types.I32) return <f64>value.get<i32>();
  if (type == JSON.Types.U64) return <f64>value.get<u64>();
  if (type == JSON.Types.U32) return <f64>value.get<u32>();
  return NaN;
}

/**
 * The list at `key`, or null when absent or not a list. json-as keeps parsed lists as JSON.Arr:
 * `.length`, and `.at(i)` for each JSON.Value (`value.get<JSON.Value[]>()` aborts on them).
 */
export function arrayAt(obj: JSON.Obj, key: string): JSON.Arr | null {
  const value = obj.get(key);
  if (value == null || value.type != JSON.Types.Array) return null;
  return value.get<JSON.Arr>();
}

/** The strings of the list at `key` (other elements skipped); empty when absent or not a list. */
export function stringsAt(obj: JSON.Obj, key: string): string[] {
  const out: string[] = [];
  const list = arrayAt(obj, key);
  if (list == null) return out;
  for (let i = 0; i < list.length; i++) {
    const value = list.at(i);
    if (value.type == JSON.Types.String) out.push(value.get<string>());
  }
  return out;
}

/** The maps of the list at `key` (containers, volumes; other elements skipped); empty when absent. */
export function objectsAt(obj: JSON.Obj, key: string): JSON.Obj[] {
  const out: JSON.Obj[] = [];
  const list = arrayAt(obj, key);
  if (list == null) return out;
  for (let i = 0; i < list.length; i++) {
    const value = list.at(i);
    if (value.type == JSON.Types.Object) out.push(value.get<JSON.Obj>());
  }
  return out;
}

// Issue 14: the input in one host call that copies it into a buffer of ours. Extism's
// Host.input() makes one host call per 8 bytes, a third of a small policy's time.
// @ts-expect-error: decorators allowed here
@external('extism:host/user', 'portcullis_input_length')
declare function portcullisInputLength(): i32;

// @ts-expect-error: decorators allowed here
@external('extism:host/user', 'portcullis_input_read')
declare function portcullisInputRead(offset: usize): void;

function readInput(): JSON.Obj {
  const buffer = new ArrayBuffer(portcullisInputLength());
  portcullisInputRead(changetype<usize>(buffer));
  return JSON.parse<JSON.Obj>(String.UTF8.decode(buffer));
}

function writeOutput(text: string): void {
  // Host.outputString miscounts non-ASCII text; write the UTF-8 bytes ourselves.
  Host.output(Uint8Array.wrap(String.UTF8.encode(text)));
}

function render(result: Result, ctx: Context, withPatch: bool): string {
  let out = '{"outcome":"' + result.outcome + '"';
  if (result.outcome == 'deny') out += ',"code":' + result.code.toString();
  if (result.outcome == 'error') out += ',"kind":"' + result.kind + '"';
  if (result.outcome != 'allow') out += ',"message":' + JSON.stringify<string>(result.message);
  if (ctx.warnings.length > 0) out += ',"warnings":' + JSON.stringify<string[]>(ctx.warnings);
  if (withPatch && result.outcome == 'allow' && ctx.patched) out += ',"patch":[' + ctx.patch.ops.join(',') + ']';
  return out + '}';
}

export function handleValidate(handler: (ctx: Context) => Result): i32 {
  const ctx = new Context(readInput());
  writeOutput(render(handler(ctx), ctx, false));
  return 0;
}

export function handleMutate(handler: (ctx: Context) => Result): i32 {
  const ctx = new Context(readInput());
  writeOutput(render(handler(ctx), ctx, true));
  return 0;
}

/** `check` returns null when the settings are fine, or a message saying what is wrong. */
export function handleSettings(check: (settings: JSON.Obj) => string | null): i32 {
  const input = readInput();
  const message = check(objectAt(input, 'settings') || new JSON.Obj());
  writeOutput(message == null ? '{"valid":true}' : '{"valid":false,"message":' + JSON.stringify<string>(message!) + '}');
  return 0;
}

/** Installed as the module's `abort` by the build: tell the host why, then trap. */
export function portcullisAbort(message: string | null, fileName: string | null, line: u32, column: u32): void {
  let text = 'abort: ' + (message !== null ? message : '(no message)');
  if (fileName !== null) text += ' at ' + fileName + ':' + line.toString() + ':' + column.toString();
  Host.log(LogLevel.Error, text);
  unreachable();
}
