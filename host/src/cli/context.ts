// `portcullis run --context OBJECTS.yaml [--grant apiVersion/Kind ...]`: a hub filled from a
// file. Without --grant every kind in the file is granted; with it, exactly the kinds given,
// so a missing grant can be tried offline too.
import { UsageError } from './usage.ts';
import { grantedKinds, type Grant } from '../context/grants.ts';
import { ContextHub } from '../context/hub.ts';
import { loadContextFile, loadOffline } from '../context/offline.ts';

export async function loadContext(file: string, grantFlags: string[]): Promise<{ hub: ContextHub; grants: Grant[] }> {
  const objects = await loadContextFile(file);
  const grants = grantFlags.length > 0
    ? grantFlags.map(parseGrantFlag)
    : grantedKinds([objects.map((o) => ({ apiVersion: asText(o.apiVersion), kind: asText(o.kind) }))]);
  return { hub: offlineHub(objects, grants), grants };
}

/** For `run --config`: the objects of the file, for the kinds the configuration's policies are granted (what the file lacks is empty). */
export async function loadContextObjects(file: string, grants: readonly Grant[]): Promise<ContextHub> {
  return offlineHub(await loadContextFile(file), grants);
}

function offlineHub(objects: Parameters<typeof loadOffline>[1], grants: readonly Grant[]): ContextHub {
  const hub = new ContextHub();
  loadOffline(hub, objects, grants);
  return hub;
}

/** "v1/Namespace" or "networking.k8s.io/v1/Ingress": the kind is the last segment. */
export function parseGrantFlag(flag: string): Grant {
  const slash = flag.lastIndexOf('/');
  const apiVersion = flag.slice(0, slash);
  const kind = flag.slice(slash + 1);
  if (slash <= 0 || !/^[A-Z][A-Za-z0-9]*$/.test(kind) || !/^([a-z0-9.-]+\/)?v[0-9]+[a-z0-9]*$/.test(apiVersion)) {
    throw new UsageError(`--grant takes apiVersion/Kind, like v1/Namespace or networking.k8s.io/v1/Ingress; not "${flag}"`);
  }
  return { apiVersion, kind };
}

function asText(value: unknown): string {
  return typeof value === 'string' ? value : JSON.stringify(value) ?? '';
}
