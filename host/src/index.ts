// The programmatic API of the host (used by @portcullis/sdk/testing and by embedders).
export { PortcullisError, PolicyLoadError, PolicySettingsError, ReviewError, ConfigError } from './errors.ts';
export { evaluatePolicy } from './evaluate/evaluate.ts';
export type { Outcome, FailureKind } from './sandbox/outcome.ts';
export { merge } from './merge/merge.ts';
export type { Evaluated, MergeResult } from './merge/merge.ts';
export { loadPolicy } from './policy/load.ts';
export type { LoadedPolicy, PolicyOptions, FailurePolicy, Enforcement, Isolation } from './policy/loaded.ts';
export { parseReview, parseReviewText } from './review/parse.ts';
export type { AdmissionReview, ReviewVersion } from './review/parse.ts';
export { respond } from './review/respond.ts';
export type { Decision, AdmissionResponseReview } from './review/respond.ts';
export { SandboxPool } from './sandbox/pool.ts';
export { ContextHub } from './context/hub.ts';
export { ContextError, grantedKinds } from './context/grants.ts';
export type { Grant } from './context/grants.ts';
export { loadContextFile, loadOffline, parseContextObjects } from './context/offline.ts';
export { DEFAULT_LIMITS } from './config/limits.ts';
export type { SandboxLimits } from './config/limits.ts';
