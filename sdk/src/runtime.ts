// Wiring used by the generated component entry (sdk/build). Not part of the policy API.
export { bindHostLog } from './policy.ts';
export { bindContextReader } from './context.ts'; // issue 15
