// Deny DELETE of any object labelled portcullis.dev/no-delete: "true" (kinitiras' example).
import { Context, Result, handleValidate } from '@portcullis/sdk/assembly';

const LABEL = 'portcullis.dev/no-delete';

function check(ctx: Context): Result {
  if (ctx.operation != 'DELETE') return Result.allow();
  const value = ctx.label(LABEL);
  if (value !== null && value == 'true') {
    const name = ctx.request.has('name') ? ctx.request.getAs<string>('name') : '';
    return Result.deny(name + ' is protected by the label ' + LABEL + '="true"; remove the label to delete it');
  }
  return Result.allow();
}

export function validate(): i32 {
  return handleValidate(check);
}
