// A training run's output folder: lock, stale temporary files, fresh/resume/overwrite
// (run_folder.h).
#include "apps/common/run_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace clustr {

namespace fs = std::filesystem;

namespace {

constexpr const char* kLockFile = ".lock";

std::string reason(const std::error_code& ec) { return ec.message(); }

// NAME.tmp.PID or NAME.tmp.PID.N: what an atomic write leaves when its process is killed.
bool is_temporary(const std::string& name) {
  const size_t at = name.rfind(".tmp.");
  if (at == std::string::npos || at == 0) return false;
  const std::string tail = name.substr(at + 5);
  if (tail.empty() || tail.front() == '.' || tail.back() == '.') return false;
  int dots = 0;
  for (char c : tail) {
    if (c == '.') {
      ++dots;
    } else if (c < '0' || c > '9') {
      return false;
    }
  }
  return dots <= 1;
}

std::string join(const std::vector<std::string>& names, size_t most) {
  std::string s;
  for (size_t i = 0; i < names.size() && i < most; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > most) s += detail::cat(" and ", names.size() - most, " more");
  return s;
}

std::vector<std::string> sorted_entries(const std::string& folder) {
  std::vector<std::string> names;
  std::error_code ec;
  for (fs::directory_iterator it(folder, ec), end; !ec && it != end; it.increment(ec))
    names.push_back(it->path().filename().string());
  CLUSTR_CHECK(!ec, "cannot list the folder ", folder, ": ", reason(ec));
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::vector<std::string> folder_entries(const std::string& folder) {
  std::vector<std::string> names = sorted_entries(folder);
  names.erase(std::remove(names.begin(), names.end(), std::string(kLockFile)), names.end());
  return names;
}

void check_output_file(const std::string& flag, const std::string& path, bool overwrite,
                       bool folder_must_exist) {
  std::error_code ec;
  CLUSTR_CHECK(!fs::is_directory(path, ec), flag, " ", path,
               ": is a folder; expected the file to write");
  CLUSTR_CHECK(overwrite || !fs::exists(path, ec), path,
               " exists: pass --overwrite to replace it");
  const fs::path folder = fs::path(path).parent_path();
  CLUSTR_CHECK(!folder_must_exist || folder.empty() || fs::is_directory(folder, ec), flag, " ",
               path, ": the folder ", folder.string(), " does not exist");
}

std::string first_free_folder(const std::string& base) {
  for (int i = 1;; ++i) {
    const std::string p = i == 1 ? base : detail::cat(base, "-", i);
    std::error_code ec;
    if (!fs::exists(p, ec) && !ec) return p;
    if (fs::is_directory(p, ec) && folder_entries(p).empty()) return p;
    CLUSTR_CHECK(i < 100000, "no free output folder among ", base, ", ", base, "-2, ... ",
                 base, "-", i, " (give --out)");
  }
}

std::string choose_out_folder(const std::string& out, bool out_given, const std::string& resume,
                              OutMode mode, std::FILE* log) {
  if (out_given) return out;
  if (!resume.empty()) {
    const fs::path p(resume);
    std::error_code ec;
    const std::string folder = fs::is_directory(p, ec) ? p.string() : p.parent_path().string();
    return folder.empty() ? std::string(".") : folder;
  }
  if (mode != OutMode::fresh) return out;
  const std::string chosen = first_free_folder(out);
  if (chosen != out && log)
    std::fprintf(log, "%s holds an earlier run; this one writes to %s\n", out.c_str(),
                 chosen.c_str());
  return chosen;
}

OutMode out_mode(bool resume, bool overwrite) {
  CLUSTR_CHECK(!(resume && overwrite), "--overwrite starts a new run in place of the one in the "
               "output folder, and --resume continues a run: give one of them");
  return resume ? OutMode::resume : overwrite ? OutMode::overwrite : OutMode::fresh;
}

RunFolder::RunFolder(const std::string& path, OutMode mode,
                     const std::vector<std::string>& app_files, std::FILE* log, const char* flag)
    : path_(path) {
  std::error_code ec;
  CLUSTR_CHECK(!fs::exists(path, ec) || fs::is_directory(path, ec), flag, " ", path,
               " exists and is not a folder");
  fs::create_directories(path, ec);
  CLUSTR_CHECK(!ec, flag, ": cannot create the folder ", path, ": ", reason(ec));

  // The lock: one live run per folder. flock is released by the kernel when the process ends,
  // however it ends, so a killed run never leaves the folder locked.
  const std::string lock = file(kLockFile);
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  CLUSTR_CHECK(lock_fd_ >= 0, flag, ": cannot open the lock file ", lock, ": ",
               std::strerror(errno));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {0};
    const ssize_t n = ::pread(lock_fd_, pid, sizeof pid - 1, 0);
    ::close(lock_fd_);
    lock_fd_ = -1;
    CLUSTR_CHECK(err != EWOULDBLOCK, flag, " ", path, " is in use by another run (process ",
                 n > 0 ? std::string(pid, size_t(n)) : std::string("unknown"),
                 "); wait for it to end, or give another ", flag);
    throw Error(detail::cat(flag, ": cannot lock ", lock, ": ", std::strerror(err)));
  }
  try {
    check_contents(mode, app_files, log, flag);
  } catch (...) {
    ::close(lock_fd_);  // the destructor does not run for a constructor that throws
    lock_fd_ = -1;
    throw;
  }
}

void RunFolder::check_contents(OutMode mode, const std::vector<std::string>& app_files,
                               std::FILE* log, const char* flag) {
  const std::string& path = path_;
  std::error_code ec;
  const std::string me = std::to_string(::getpid());
  if (::ftruncate(lock_fd_, 0) != 0 || ::pwrite(lock_fd_, me.data(), me.size(), 0) < 0) {
    // The pid is only for the message another run prints; the lock holds without it.
  }

  // Temporary files of writes that a killed run never finished.
  std::vector<std::string> stale;
  for (const std::string& name : sorted_entries(path))
    if (is_temporary(name) && fs::is_regular_file(file(name), ec)) stale.push_back(name);
  for (const std::string& name : stale) {
    CLUSTR_CHECK(fs::remove(file(name), ec) || !ec, flag, ": cannot remove the stale temporary "
                 "file ", file(name), ": ", reason(ec));
  }
  if (!stale.empty() && log)
    std::fprintf(log, "removed %zu temporary file(s) that an interrupted run left in %s: %s\n",
                 stale.size(), path.c_str(), join(stale, 8).c_str());

  const std::vector<std::string> present = folder_entries(path);
  if (mode == OutMode::fresh) {
    CLUSTR_CHECK(present.empty(), flag, " ", path, " already holds files (", join(present, 8),
                 "), which a new run would replace; give --resume ", path,
                 " to continue the run there, --overwrite to replace it, or another ", flag);
  } else if (mode == OutMode::overwrite) {
    std::vector<std::string> removed;
    for (const std::string& name : app_files) {
      if (!fs::is_regular_file(file(name), ec)) continue;
      CLUSTR_CHECK(fs::remove(file(name), ec), flag, ": --overwrite cannot remove ", file(name),
                   ": ", reason(ec));
      removed.push_back(name);
    }
    if (!removed.empty() && log)
      std::fprintf(log, "--overwrite: removed the earlier run's %s from %s\n",
                   join(removed, 16).c_str(), path.c_str());
  }
}

RunFolder::~RunFolder() {
  if (lock_fd_ >= 0) ::close(lock_fd_);  // closing releases the flock
}

std::string RunFolder::file(const std::string& name) const {
  return (fs::path(path_) / name).string();
}

}  // namespace clustr
