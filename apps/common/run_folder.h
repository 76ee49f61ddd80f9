// A training run's output folder, kept so that no run loses or mixes up another's files:
//
//   - a new run refuses a folder that already holds files, naming them, unless it continues
//     the run there (--resume) or is told to replace it (--overwrite, which first removes the
//     files the app writes);
//   - an advisory lock (flock on <folder>/.lock, held while the RunFolder lives) refuses a
//     second live run in the same folder, naming the process that holds it;
//   - temporary files that a killed run left behind (the atomic writes' NAME.tmp.PID[.N]) are
//     removed: under the lock no other run can be writing them;
//   - a run without --out picks the first of runs/<app>, runs/<app>-2, runs/<app>-3, ... that
//     is absent or empty (first_free_folder), so running an app twice keeps both runs.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace clustr {

enum class OutMode {
  fresh,      // a new run: the folder must be absent or empty
  resume,     // continuing a run (--resume): the folder may hold its files
  overwrite,  // a new run replacing an old one (--overwrite): the app's files are removed
};

class RunFolder {
 public:
  // Creates `path` (and its parents), takes its lock, removes stale temporary files and
  // checks the folder for `mode`. app_files: the names the app writes there (metrics.csv, its
  // checkpoints and plots), which --overwrite removes. Lines about what was removed go to
  // `log` (nullptr: silent). Throws clustr::Error naming the flag (`flag`, e.g. "--out").
  RunFolder(const std::string& path, OutMode mode, const std::vector<std::string>& app_files,
            std::FILE* log, const char* flag = "--out");
  ~RunFolder();  // releases the lock (the lock file stays; removing it would race a new run)
  RunFolder(const RunFolder&) = delete;
  RunFolder& operator=(const RunFolder&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const;  // path/name

 private:
  // After the lock: records this process in the lock file, removes stale temporaries and
  // checks the folder's files for `mode`.
  void check_contents(OutMode mode, const std::vector<std::string>& app_files, std::FILE* log,
                      const char* flag);

  std::string path_;
  int lock_fd_ = -1;
};

// The same rule for one output file (a language model, a CSV, a PNG): checks, before the work
// that leads to it, that `path` (given as `flag`) may be written: it is not a folder, it does not
// exist unless `overwrite`, and, with `folder_must_exist`, the folder it goes in exists. Throws
// clustr::Error naming the flag and the path.
void check_output_file(const std::string& flag, const std::string& path, bool overwrite,
                       bool folder_must_exist);

// `base` when it does not exist or is an empty folder, else the first of base-2, base-3, ...
// that is.
std::string first_free_folder(const std::string& base);

// The names in `folder` that a new run would collide with: every entry but the lock file.
std::vector<std::string> folder_entries(const std::string& folder);

// The output folder of a training command: `out` when given on the command line (out_given);
// else, when resuming, the folder of the --resume path (the folder itself, or a file's
// folder); else, for a new run, first_free_folder(out), with a line on `log` when that is not
// `out` itself.
std::string choose_out_folder(const std::string& out, bool out_given, const std::string& resume,
                              OutMode mode, std::FILE* log);

// The mode of a training command from its flags; refuses --overwrite with --resume (one
// continues a run, the other replaces it).
OutMode out_mode(bool resume, bool overwrite);

}  // namespace clustr
