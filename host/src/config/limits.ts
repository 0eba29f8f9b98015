// A policy's sandbox limits and their defaults. The defaults live in config.schema.json (the
// one place a configuration field is described); this module only reads them out, so the
// schema, the documentation generated from it and the host cannot disagree.
import schema from '../../config.schema.json' with { type: 'json' };

export interface SandboxLimits {
  timeoutMs: number;
  memoryMiB: number;
  maxOutputBytes: number;
  /** The largest policy file the host will read; checked before reading it. */
  maxModuleMiB: number;
}

const limits = schema.definitions.limits.properties;

/** The largest policy file any configuration may allow (limits.maxModuleMiB's maximum): what the CLI reads at most. */
export const MAX_MODULE_FILE_BYTES: number = limits.maxModuleMiB.maximum * 2 ** 20;

export const DEFAULT_LIMITS: SandboxLimits = Object.freeze({
  timeoutMs: limits.timeoutMs.default,
  memoryMiB: limits.memoryMiB.default,
  maxOutputBytes: limits.maxOutputBytes.default,
  maxModuleMiB: limits.maxModuleMiB.default,
});
