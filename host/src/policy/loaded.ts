// What the host knows about a policy once it is loaded and ready to evaluate.
import type { JsonValue, Mode } from '@portcullis/sdk';
import type { Grant } from '../config/types.ts';
import type { SandboxLimits } from '../config/limits.ts';
import type { PolicyInfo } from './metadata.ts';
import type { ModuleKind } from '../sandbox/module-kind.ts';

import type { Enforcement, FailurePolicy, Isolation } from '../config/types.ts';

export type { Enforcement, FailurePolicy, Isolation };

export interface PolicyOptions {
  name: string;
  /** A path, a file:// URL, or (with the OCI fetcher) an oci:// reference. */
  module: string;
  settings: JsonValue;
  limits: SandboxLimits;
  failurePolicy: FailurePolicy;
  enforcement: Enforcement;
  isolation: Isolation;
  /** Kinds of cluster object it may read; absent or empty: none. */
  context?: Grant[];
}

export interface LoadedPolicy extends PolicyOptions {
  /** Unique per name and module digest: a reload of changed bytes gets a new sandbox. */
  key: string;
  digest: string;
  kind: ModuleKind;
  modes: Mode[];
  /** Its SDK reads the request's object and oldObject passed apart, each parsed when first read (SharedInput.apart). */
  objectsApart?: boolean;
  /** ... and values apart inside those values, each in the same form (its SharedInput.apart lists them). */
  nestedApart?: boolean;
  /** What the module says about itself (portcullis build embeds it); absent in older modules. */
  info?: PolicyInfo;
}
