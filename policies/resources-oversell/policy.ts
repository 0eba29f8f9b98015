// kinitiras' template: set every container's resources.requests to its limits times
// settings.cpuFactor / settings.memoryFactor, so a cluster can be oversold on purpose.
import { definePolicy, scaleQuantity, type JsonObject, type JsonValue } from '@portcullis/sdk';

interface Settings {
  cpuFactor?: number;
  memoryFactor?: number;
}

const CONTAINER_LISTS = ['initContainers', 'containers'] as const;

function isObject(value: JsonValue | undefined): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function checkFactor(name: string, value: unknown): string | undefined {
  if (value === undefined) return undefined;
  if (typeof value !== 'number' || !(value > 0) || value > 1) return `${name} must be a number in (0, 1], got ${JSON.stringify(value)}`;
  return undefined;
}

export default definePolicy<Settings>({
  validateSettings(settings) {
    return checkFactor('cpuFactor', settings?.cpuFactor) ?? checkFactor('memoryFactor', settings?.memoryFactor);
  },
  mutate({ object, settings, patch, warnings }) {
    const spec = object?.spec;
    if (!isObject(spec)) return;
    const factors: Record<string, number> = { cpu: settings.cpuFactor ?? 0.5, memory: settings.memoryFactor ?? 0.5 };
    for (const list of CONTAINER_LISTS) {
      const containers = spec[list];
      if (!Array.isArray(containers)) continue;
      containers.forEach((container, index) => {
        if (!isObject(container)) return;
        const limits = isObject(container.resources) ? container.resources.limits : undefined;
        if (!isObject(limits)) return;
        for (const [resource, factor] of Object.entries(factors)) {
          const limit = limits[resource];
          if (typeof limit !== 'string' && typeof limit !== 'number') continue;
          try {
            patch.set(['spec', list, index, 'resources', 'requests', resource], scaleQuantity(limit, factor));
          } catch (error) {
            warnings.push(`${list}[${index}] ${resource} limit ${JSON.stringify(limit)} left as is: ${(error as Error).message}`);
          }
        }
      });
    }
  },
});
