// bench/intake.ts only: the limit server that also calls the AssemblyScript no-delete policy in
// its own thread, with no worker and no message: what evaluating a cheap policy in the intake
// thread would cost at best. It has none of the sandbox's deadline (a loop here would stop the
// server), so it is an experiment, not a design Portcullis can ship as is.
import { serve } from './bare-server.ts';
import { noDeleteAllows } from './no-delete-guest.ts';

interface Review {
  apiVersion: string;
  request: { uid: string };
}

await serve(async (_path, body) => {
  const review = JSON.parse(body) as Review;
  const allowed = await noDeleteAllows(body);
  return { apiVersion: review.apiVersion, kind: 'AdmissionReview', response: { uid: review.request.uid, allowed } };
});
