/* hub.h — models by name: a Hugging Face hub repository's files downloaded
 * into the huggingface_hub cache, named by their local path.
 *
 * The model of the world is huggingface_hub's (and llama.cpp's since it
 * adopted the same cache): a file of repository owner/name at revision main
 * is fetched from $HF_ENDPOINT/owner/name/resolve/main/FILE (the hub may
 * redirect to a CDN), stored once under its ETag as
 *   $HF_HUB_CACHE/models--owner--name/blobs/ETAG
 * and linked as snapshots/COMMIT/FILE -> ../../blobs/ETAG, refs/main holding
 * COMMIT (the X-Repo-Commit the hub answered).  A download in progress is
 * blobs/ETAG.incomplete and is resumed with a Range request, by a retry in
 * the same run or by the next run.  When the ETag is a SHA-256 (a large file
 * kept in LFS: X-Linked-Etag) the finished file is checked against it.
 *
 * Environment: HF_ENDPOINT (default https://huggingface.co), HF_HUB_CACHE,
 * else $HF_HOME/hub, else ~/.cache/huggingface/hub; HF_TOKEN (sent as a
 * bearer token to the hub, never to the CDN it redirects to);
 * HF_HUB_OFFLINE=1 reads the cache only.  When the hub cannot be reached, a
 * file already in the cache is used (with a note).
 *
 * This is the CLI's module (libcurl, json-c): the library never downloads.
 * Errors are printed ("kvllm: error: ..." naming the URL) and returned as 1. */
#ifndef KVLLM_CLI_HUB_H
#define KVLLM_CLI_HUB_H

#include <stdbool.h>

/* What a repository name stands for when it holds both kinds of model. */
enum hub_prefer {
    HUB_PREFER_GGUF,     /* llama.cpp's -hf: a .gguf file (QUANT picks which) */
    HUB_PREFER_FOLDER,   /* vLLM's serve REPO: the Hugging Face folder (config.json, safetensors) */
};

/* Whether s looks like a repository name (owner/name, optionally :QUANT),
 * names no existing file or folder, and does not end as a model file does
 * (.gguf, .bin, .safetensors, .json, .model: a missing file stays a path). */
bool hub_is_repo_name(const char *s);

/* The local path of the model SPEC = owner/name[:QUANT] names: FILE when
 * given (llama.cpp's --hf-file), else a .gguf of the repository whose name
 * holds QUANT (case-insensitive; without QUANT: Q4_K_M, else Q8_0, else the
 * first), else (or first, with HUB_PREFER_FOLDER) its Hugging Face folder.
 * token: HF_TOKEN's stand-in when not NULL.  *path is malloc'd (the caller
 * frees it).  0, or 1 with the reason printed. */
int hub_model_path(const char *spec, const char *file, const char *token, enum hub_prefer prefer, char **path);

#endif
