// An app's training command, from its parsed flags to the trained run, the same for every app:
// the settings checked, the output folder chosen (the given --out, the resumed run's folder, or
// the first free default) and opened before any data is read (an unusable GPU is refused even
// before that), the trainer built, its settings printed, a checkpoint resumed, the run trained.
#pragma once

#include <cstdio>
#include <string>

#include "apps/common/device.h"
#include "apps/common/run_folder.h"

namespace clustr {

// Options has .output.out and .output.overwrite and its app's validate(Options) (found by
// argument-dependent lookup); Trainer has Trainer(Options, FILE*), run_files(), print_config,
// resume and run(RunFolder*). Returns run()'s result (its interrupted_by says whether a signal
// stopped it).
template <class Trainer, class Options>
auto train_command(Options& o, const std::string& resume, bool out_given) {
  const OutMode mode = out_mode(!resume.empty(), o.output.overwrite);
  validate(o);
  o.output.out = choose_out_folder(o.output.out, out_given, resume, mode, stdout);
  resolve_device(o.device);  // an unusable GPU is refused before the folder is made
  RunFolder folder(o.output.out, mode, Trainer::run_files(), stdout);
  Trainer trainer(o, stdout);
  trainer.print_config(stdout);
  if (!resume.empty()) trainer.resume(resume);
  return trainer.run(&folder);
}

}  // namespace clustr
