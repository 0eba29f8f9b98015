// Keeps the host's on-disk cache under a size budget (`cache.maxMiB`). The cache only grows:
// every policy version adds its pulled blobs, its transpiled component, its compile trials and
// Node's compiled code, and nothing removed them. In the deployment the cache is an emptyDir with
// a size limit, and the kubelet evicts a pod whose emptyDir passes its limit: a host that lived
// through enough policy updates would have been evicted for it.
//
// Least recently used first, by the time a file was last used (util/files.ts touch() marks every
// cache hit and write), never what the current policy set used (touched since its load began)
// nor anything used within the last PRUNE_GRACE_MS (a set still draining after a reload). Only
// what is read while a policy loads goes: blobs are pulled, components transpiled and modules
// tried again when next needed. The jco glue is never pruned: sandbox workers import it again
// whenever one replaces another, for as long as a TypeScript policy is loaded (review: a replaced
// worker that found it gone failed every call of the policy). It is one file per glue revision.
import type { Dirent } from 'node:fs';
import { lstat, readdir, rm } from 'node:fs/promises';
import { dirname, isAbsolute, join, relative, resolve } from 'node:path';
import { cacheDir, forgetTouch, touchedAt } from '../util/files.ts';

/** Files used this recently are kept whatever the budget. */
export const PRUNE_GRACE_MS = 60 * 60 * 1000;
/** A walk stops after this many files: a folder holding more is not one this host filled. */
export const PRUNE_MAX_FILES = 200_000;
/** The cache's own subfolders: the rest of cacheDir() may be someone else's. */
export const CACHE_FOLDERS = ['oci', 'transpiled', 'compile-trials', 'node-compile-cache'];
/** Tag indexes: small, and a missing one loses what a tag resolved to when the registry is down. */
const KEPT_NAMES = new Set(['index.json']);
/** Folders never pruned, under any pruned folder (see the glue above). */
const KEPT_FOLDERS = new Set([join('transpiled', 'glue')]);

export interface PruneOptions {
  /** The folders pruned, each whole: by default cacheFolders(). */
  folders: string[];
  maxBytes: number;
  /** Files used at or after this (epoch ms) are kept: what the current policy set was loaded from. */
  keepSince: number;
  now?: number;
  /** The walk stops after this many files (default PRUNE_MAX_FILES), and nothing is pruned. */
  maxFiles?: number;
}

export interface PruneResult {
  removedFiles: number;
  removedBytes: number;
  /** What the folders hold after pruning. */
  keptBytes: number;
  /** Still above the budget: what is in use, or was used within the grace period, is more. */
  overBudget: boolean;
  /** Files that could not be removed (permissions, a read-only cache). */
  failed: number;
  /** The walk stopped at PRUNE_MAX_FILES. */
  truncated: boolean;
}

/**
 * cacheDir()'s own subfolders, and the blob store of an OCI cache the configuration moved
 * (`registries.cacheDir`): only its `blobs` folder, which nothing but the cache writes (review:
 * `cacheDir: .` beside the configuration file had the prune take the whole folder). A folder
 * inside another is walked once, with it.
 */
export function cacheFolders(ociDir?: string): string[] {
  const root = cacheDir();
  const folders = CACHE_FOLDERS.map((name) => resolve(root, name));
  if (ociDir) folders.push(resolve(ociDir, 'blobs'));
  return folders.filter((folder, i) => !folders.some((other, j) => j !== i && (within(folder, other) ? folder !== other || j < i : false)));
}

/** `inner` is `outer` or inside it. */
function within(inner: string, outer: string): boolean {
  const path = relative(outer, inner);
  return path === '' || (!path.startsWith('..') && !isAbsolute(path));
}

interface CachedFile {
  path: string;
  bytes: number;
  usedAt: number;
}

export async function pruneCache(options: PruneOptions): Promise<PruneResult> {
  const now = options.now ?? Date.now();
  const files: CachedFile[] = [];
  let truncated = false;
  for (const folder of options.folders) {
    if (await walk(folder, files, options.maxFiles ?? PRUNE_MAX_FILES)) {
      truncated = true;
      break;
    }
  }
  let total = files.reduce((sum, f) => sum + f.bytes, 0);
  const result: PruneResult = { removedFiles: 0, removedBytes: 0, keptBytes: total, overBudget: false, failed: 0, truncated };
  // Not a folder this host filled: prune nothing on a partial view of it.
  if (truncated || total <= options.maxBytes) return result;
  const keepFrom = Math.min(options.keepSince, now - PRUNE_GRACE_MS);
  const candidates = files.filter((f) => f.usedAt < keepFrom).sort((a, b) => a.usedAt - b.usedAt);
  for (const file of candidates) {
    if (total <= options.maxBytes) break;
    // Used since the walk (a reload loading meanwhile), or gone: kept.
    if (((await lastUse(file.path))?.usedAt ?? Infinity) >= keepFrom) continue;
    try {
      await rm(file.path);
      forgetTouch(file.path);
      total -= file.bytes;
      result.removedFiles++;
      result.removedBytes += file.bytes;
    } catch {
      result.failed++;
    }
  }
  result.keptBytes = total;
  result.overBudget = total > options.maxBytes;
  return result;
}

/** Adds the regular files under `folder` (symbolic links are not followed); true when it stopped at `maxFiles`. */
async function walk(folder: string, files: CachedFile[], maxFiles: number): Promise<boolean> {
  const pending = [folder];
  while (pending.length > 0) {
    const dir = pending.pop()!;
    let entries: Dirent[];
    try {
      entries = await readdir(dir, { withFileTypes: true });
    } catch {
      continue; // not there (yet), or not readable: nothing to prune
    }
    for (const entry of entries) {
      const path = join(dir, entry.name);
      if (entry.isDirectory() && !KEPT_FOLDERS.has(relative(dirname(folder), path))) pending.push(path);
      if (!entry.isFile() || KEPT_NAMES.has(entry.name)) continue;
      if (files.length >= maxFiles) return true;
      const use = await lastUse(path);
      if (use) files.push({ path, ...use });
    }
  }
  return false;
}

/** The file's size and when it was last used, read now; undefined when it is gone or not a regular file. */
async function lastUse(path: string): Promise<{ bytes: number; usedAt: number } | undefined> {
  const stat = await lstat(path).catch(() => undefined);
  return stat?.isFile() ? { bytes: stat.size, usedAt: Math.max(stat.mtimeMs, touchedAt(path) ?? 0) } : undefined;
}
