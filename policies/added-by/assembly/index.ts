// Annotate every object with portcullis.dev/added-by: <settings.value>.
import { Context, JSON, Result, handleMutate, handleSettings, stringAt } from '@portcullis/sdk/assembly';

function annotate(ctx: Context): Result {
  if (ctx.object == null) return Result.allow();
  const value = stringAt(ctx.settings, 'value');
  ctx.patch.setString(['metadata', 'annotations', 'portcullis.dev/added-by'], value != null ? value! : 'portcullis');
  return Result.allow();
}

function checkSettings(settings: JSON.Obj): string | null {
  if (settings.has('value') && stringAt(settings, 'value') == null) return 'settings.value must be a string';
  return null;
}

export function mutate(): i32 {
  return handleMutate(annotate);
}

export function validate_settings(): i32 {
  return handleSettings(checkSettings);
}
