// Checkpoints are Hugging Face safetensors of the full tensors. <save_dir>/<step>/ holds
//   model.safetensors      every parameter, unsharded, under its Hugging Face name (fp32)
//   optimizer.safetensors  AdamW's moments: <name>.exp_avg and <name>.exp_avg_sq
//   config.json            the architecture: transformers' from_pretrained opens the folder
//   state.json             step, data position, seed, layout, architecture fingerprint, and a
//                          checksum per tensor
// and the tokenizer the run trained with, its bos/eos ids and fingerprint (checkpoint_tokenizer.h).
// Each rank writes and reads only the block of each tensor it holds, at its offset in the file:
// saving scales with the ranks, and a checkpoint written under any layout loads into any other.
// Under ZeRO-1 (distributed.zero1) each cp*dp replica writes and reads the moments of its own
// shard, ranges of the flat buffer that may cut a tensor mid-row; the files are the same either
// way, so a run can switch ZeRO-1 on or off when it resumes.
#pragma once
#include "model.h"
#include "optimizer.h"

// Claims cfg.save_dir for this run: a second run on it is refused in one line naming the first
// one's host and pid. Also proves the folder writable before step 1. The lock lasts until exit.
void checkpoint_lock(const char *save_dir, ProcessGroupManager *pgm);
// For a run that saves only when stopped by a signal: proves save_dir (or the folder it would be
// made in) writable before step 1, leaving nothing behind; one line and every rank exits if not
void checkpoint_check_writable(const char *save_dir, ProcessGroupManager *pgm);
// Writes <save_dir>/<step>.tmp/ and renames it <step>/ once every rank has written and synced:
// a checkpoint is whole or absent. A tensor holding an inf or a NaN is found in the checksum pass
// and refused, in one line naming it: nothing is committed. Then <save_dir>/latest names it, and
// of the steps up to it only the newest checkpoint.keep_last stay (later steps' folders, left
// by a run resumed from an earlier checkpoint, stay too).
void checkpoint_save(const Model *model, const Optimizer *opt, int step);
// The checkpoint folder <save_dir>/latest names, into dir; 0 when save_dir has none; one line
// when latest holds anything but a step number
int checkpoint_latest(char *dir, size_t size, const char *save_dir);
// Loads a checkpoint folder, or the latest one of a save_dir, whatever layout wrote it; returns
// its step, or 0 when path is this run's own save_dir and holds none yet (a first submission).
// Trusts nothing: state.json's numbers in range, config.json as checkpoint_read_config checks it,
// every tensor's checksum, every element finite; else one line naming the file and the key or
// tensor. opt NULL (./generate): the same checks, the weights alone kept.
int checkpoint_load(Model *model, Optimizer *opt, const char *path);
// A checkpoint's or Hugging Face folder's config.json into cfg's architecture keys, checked as a
// run's own config is (config_validate_file: sizes in range, heads that divide hidden_size...)
void checkpoint_read_config(Config *cfg, const char *folder, const char *who);
// A Hugging Face model folder's weights (config.json with model.safetensors, or a sharded
// model.safetensors.index.json), in F32, BF16 or F16, every element finite; the optimizer starts
// fresh
void checkpoint_init_from(Model *model, const char *folder);
