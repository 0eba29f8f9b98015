// The public API of the Portcullis TypeScript SDK. Everything exported here is API.
export type {
  AdmissionRequest, EvaluationInput, EvaluationOutput, ErrorKind, GroupVersionKind, GroupVersionResource,
  JsonObject, JsonValue, Mode, Operation, PatchOperation, PeerCertificate, PolicyMetadata, UserInfo,
} from './contract.ts';
export { AdmissionError, PermanentError, TemporaryError } from './errors.ts';
export { Patch, PatchError } from './patch.ts';
export type { PathLike } from './patch.ts';
export { get, list } from './context.ts';
export type { ListOptions } from './context.ts';
export { definePolicy } from './policy.ts';
export type { Context, LogLevel, MutationContext, PolicyDefinition, PolicyExports } from './policy.ts';
export { formatQuantity, parseQuantity, scaleQuantity } from './quantity.ts';
export type { Quantity } from './quantity.ts';
