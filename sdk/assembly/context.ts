// Context reads for AssemblyScript policies: objects from the host's cache of the cluster,
// for the kinds the policy is granted in the configuration (docs/policy-contract.md).
//
//   import { contextGet } from '@portcullis/sdk/assembly/context';
//   const ns = contextGet('v1', 'Namespace', '', namespace);
//   if (ns.failed) return ns.failure();          // not granted (permanent) or not synced (temporary)
//   if (ns.object == null) return Result.deny('no such namespace');
//
// AssemblyScript has no exceptions, so a read returns a ContextRead that says whether it
// failed; `failure()` turns it into the Result the host expects.
import { JSON } from 'json-as';
import { objectAt, Result, stringAt } from './index';

// The request is read where it lies in this module's memory and the answer written into a buffer
// it allocated: one copy each way, instead of Extism's kernel memory at 1 to 8 bytes per host
// call. The call returns the answer's length in bytes; the answer fetches it.
// @ts-expect-error: decorators allowed here
@external('extism:host/user', 'portcullis_context_call')
declare function portcullisContextCall(offset: usize, length: usize): i32;

// @ts-expect-error: decorators allowed here
@external('extism:host/user', 'portcullis_context_answer')
declare function portcullisContextAnswer(offset: usize): void;

export class ContextRead {
  failed: bool = false;
  /** "permanent" (not granted, bad request, too large) or "temporary" (cache not synced yet). */
  errorKind: string = '';
  message: string = '';
  /** get: the object, or null when it does not exist. */
  object: JSON.Obj | null = null;
  /** list: the matching objects. */
  items: JSON.Obj[] = [];

  /** The Result for a failed read: Result.fail (permanent) or Result.retry (temporary). */
  failure(): Result {
    return this.errorKind == 'temporary' ? Result.retry(this.message) : Result.fail(this.message);
  }
}

/** One object; `namespace` is "" for cluster-scoped kinds. */
export function contextGet(apiVersion: string, kind: string, namespace: string, name: string): ContextRead {
  return call('{"verb":"get","apiVersion":' + q(apiVersion) + ',"kind":' + q(kind) + ',"namespace":' + q(namespace) + ',"name":' + q(name) + '}');
}

/** Every object of a kind matching the selectors ("" means no filter): label selector syntax "a=b,!c", field selector "metadata.name=x". */
export function contextList(apiVersion: string, kind: string, namespace: string = '', labelSelector: string = '', fieldSelector: string = ''): ContextRead {
  let request = '{"verb":"list","apiVersion":' + q(apiVersion) + ',"kind":' + q(kind);
  if (namespace.length > 0) request += ',"namespace":' + q(namespace);
  if (labelSelector.length > 0) request += ',"labelSelector":' + q(labelSelector);
  if (fieldSelector.length > 0) request += ',"fieldSelector":' + q(fieldSelector);
  return call(request + '}');
}

function q(text: string): string {
  return JSON.stringify<string>(text);
}

function call(request: string): ContextRead {
  const bytes = String.UTF8.encode(request);
  const answerBytes = new ArrayBuffer(portcullisContextCall(changetype<usize>(bytes), <usize>bytes.byteLength));
  portcullisContextAnswer(changetype<usize>(answerBytes));
  const answer = JSON.parse<JSON.Obj>(String.UTF8.decode(answerBytes));
  const read = new ContextRead();
  const error = objectAt(answer, 'error');
  if (error != null) {
    read.failed = true;
    const kind = stringAt(error, 'kind');
    const message = stringAt(error, 'message');
    read.errorKind = kind != null ? kind : 'permanent';
    read.message = message != null ? message : 'context read failed';
    return read;
  }
  read.object = objectAt(answer, 'object');
  const items = answer.get('items');
  if (items != null && items.type == JSON.Types.Array) {
    // json-as keeps parsed arrays as JSON.Arr (not JSON.Value[]).
    const values = items.get<JSON.Arr>();
    for (let i = 0; i < values.length; i++) {
      const value = values.at(i);
      if (value.type == JSON.Types.Object) read.items.push(value.get<JSON.Obj>());
    }
  }
  return read;
}
