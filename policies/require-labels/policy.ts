// Pods must carry the labels named in settings.labels ({name: defaultValue}).
// validate denies a pod missing any; mutate adds the missing ones with their default values.
import { AdmissionError, definePolicy, type JsonObject, type JsonValue } from '@portcullis/sdk';

interface Settings {
  labels?: Record<string, string>;
}

function labelsOf(object: JsonObject | null): Record<string, JsonValue> {
  const metadata = object?.metadata;
  if (typeof metadata !== 'object' || metadata === null || Array.isArray(metadata)) return {};
  const labels = metadata.labels;
  return typeof labels === 'object' && labels !== null && !Array.isArray(labels) ? labels : {};
}

function missing(object: JsonObject | null, settings: Settings): string[] {
  const present = labelsOf(object);
  return Object.keys(settings.labels ?? {}).filter((name) => typeof present[name] !== 'string');
}

export default definePolicy<Settings>({
  validateSettings(settings) {
    const labels = settings?.labels;
    if (typeof labels !== 'object' || labels === null || Array.isArray(labels)) return 'settings.labels must be a map of label name to default value';
    for (const [name, value] of Object.entries(labels)) {
      if (typeof value !== 'string') return `settings.labels["${name}"] must be a string (the default value)`;
    }
    return undefined;
  },
  validate({ object, settings }) {
    if (!object) return;
    const absent = missing(object, settings);
    if (absent.length > 0) throw new AdmissionError(`missing required label${absent.length > 1 ? 's' : ''}: ${absent.join(', ')}`);
  },
  mutate({ object, settings, patch }) {
    if (!object) return;
    for (const name of missing(object, settings)) patch.set(['metadata', 'labels', name], settings.labels![name]!);
  },
});
