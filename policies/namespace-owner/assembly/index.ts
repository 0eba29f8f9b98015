// Deny objects (Pods, typically) in a namespace that has no `owner` label, so every workload
// has someone to call. Context-aware: it reads the namespace from the host's cache, so it
// needs the grant   context: [{ apiVersion: v1, kind: Namespace }]
// Settings (optional): { "label": "owner" } names the label to require.
import { Context, Result, handleSettings, handleValidate, lookupString, stringAt, JSON } from '@portcullis/sdk/assembly';
import { contextGet } from '@portcullis/sdk/assembly/context';

function check(ctx: Context): Result {
  const namespace = ctx.namespace;
  if (namespace.length == 0) return Result.allow(); // cluster-scoped: nothing to check
  const configured = stringAt(ctx.settings, 'label');
  const label = configured != null ? configured : 'owner';
  const read = contextGet('v1', 'Namespace', '', namespace);
  if (read.failed) return read.failure();
  if (read.object == null) return Result.retry('namespace "' + namespace + '" is not in the cache yet; retry shortly');
  const owner = lookupString(read.object, ['metadata', 'labels', label]);
  if (owner == null || owner.length == 0) {
    return Result.deny('namespace "' + namespace + '" has no "' + label + '" label; add one (kubectl label namespace ' +
      namespace + ' ' + label + '=<team>) before creating objects in it');
  }
  return Result.allow();
}

function checkSettings(settings: JSON.Obj): string | null {
  if (settings.has('label') && stringAt(settings, 'label') == null) return 'settings.label must be a string';
  return null;
}

export function validate(): i32 {
  return handleValidate(check);
}

export function validate_settings(): i32 {
  return handleSettings(checkSettings);
}
