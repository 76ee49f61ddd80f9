// Runs an app's executable as a user would, for the command-line tests (test_app_cli_*.cpp).
//
// run_app forks and execs the program with the given arguments (no shell: nothing is quoted or
// split), with its stdout and stderr together in one pipe, and waits for it. The result holds
// the command line (quoted as a shell would need it, with the environment and the memory limit
// it ran under), the captured output and the exit status (128 + the signal's number when a
// signal ended it, as a shell reports it).
//
// CHECK_RUN(run, cond) checks cond with the command line, the status and the output printed on
// failure; CHECK_OUTPUT_HAS (a substring), CHECK_OUTPUT_MATCHES (a regular expression, as the
// CMake test had it: CMake's syntax, where '.' matches a newline too, searched anywhere in the
// output) and CHECK_STATUS are the usual checks.
#pragma once

#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
// GCC 12 warns of maybe-uninitialized members deep in libstdc++'s <regex> when it inlines them
// (at -O1 under the sanitizers): a false positive in the library's code, not in ours.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>
#pragma GCC diagnostic pop
#include <string>
#include <utility>
#include <vector>

namespace clustr::test {

struct AppRun {
  std::string command;  // the command line, for the failure messages
  std::string output;   // stdout and stderr, interleaved as written
  int status = -1;      // the exit status; 128 + N when signal N ended the program
};

struct RunOptions {
  std::vector<std::pair<std::string, std::string>> env;  // set in the program's environment
  long address_space_kib = 0;                             // > 0: as `ulimit -v` (KiB)
};

// A word as a POSIX shell would need it written.
inline std::string shell_quote(const std::string& word) {
  if (!word.empty() &&
      word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                             "_-+=./:,@%") == std::string::npos)
    return word;
  std::string q = "'";
  for (char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

inline AppRun run_app(const std::vector<std::string>& argv, const RunOptions& options = {}) {
  AppRun run;
  for (const auto& [name, value] : options.env) run.command += name + "=" + shell_quote(value) + " ";
  for (size_t i = 0; i < argv.size(); ++i) run.command += (i ? " " : "") + shell_quote(argv[i]);
  if (options.address_space_kib > 0)
    run.command = "(ulimit -v " + std::to_string(options.address_space_kib) + " && " +
                  run.command + ")";

  int pipe_fds[2];
  REQUIRE_MESSAGE(pipe(pipe_fds) == 0, "pipe: " << std::strerror(errno));
  std::fflush(nullptr);
  const pid_t pid = fork();
  REQUIRE_MESSAGE(pid >= 0, "fork: " << std::strerror(errno));
  if (pid == 0) {
    // The child: only async-signal-safe calls until exec, except setenv (single-threaded here).
    dup2(pipe_fds[1], STDOUT_FILENO);
    dup2(pipe_fds[1], STDERR_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    for (const auto& [name, value] : options.env) setenv(name.c_str(), value.c_str(), 1);
    if (options.address_space_kib > 0) {
      const rlim_t bytes = static_cast<rlim_t>(options.address_space_kib) * 1024;
      rlimit limit{bytes, bytes};
      if (setrlimit(RLIMIT_AS, &limit) != 0) {
        std::perror("run_app: setrlimit(RLIMIT_AS)");
        _exit(126);
      }
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    std::fprintf(stderr, "run_app: cannot run %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(pipe_fds[1]);
  char buffer[65536];
  for (;;) {
    const ssize_t n = read(pipe_fds[0], buffer, sizeof buffer);
    if (n > 0) {
      run.output.append(buffer, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(pipe_fds[0]);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0) {
    REQUIRE_MESSAGE(errno == EINTR, "waitpid: " << std::strerror(errno));
  }
  run.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  return run;
}

// A CMake (cmsys) regular expression in ECMAScript syntax: an unescaped '.' outside a bracket
// expression matches any character there, a newline included.
inline std::string cmake_regex(const std::string& pattern) {
  std::string out;
  bool in_brackets = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      out += c;
      out += pattern[++i];
    } else if (in_brackets) {
      out += c;
      // ']' right after '[' or '[^' is a member, not the end.
      if (c == ']' && !(pattern[i - 1] == '[' || (pattern[i - 1] == '^' && pattern[i - 2] == '[')))
        in_brackets = false;
    } else if (c == '[') {
      in_brackets = true;
      out += c;
    } else if (c == '.') {
      out += "[\\s\\S]";
    } else {
      out += c;
    }
  }
  return out;
}

// The argument lists joined, in order.
inline std::vector<std::string> cat(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> all;
  for (const auto& p : parts) all.insert(all.end(), p.begin(), p.end());
  return all;
}

inline bool contains(const AppRun& run, const std::string& text) {
  return run.output.find(text) != std::string::npos;
}

// The parts of a pattern between its top-level ".*" (outside brackets and parentheses).
inline std::vector<std::string> split_at_any(const std::string& pattern) {
  std::vector<std::string> parts(1);
  int depth = 0;
  bool in_brackets = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      parts.back() += pattern.substr(i++, 2);
      continue;
    }
    if (in_brackets) {
      in_brackets = !(c == ']' && pattern[i - 1] != '[' &&
                      !(pattern[i - 1] == '^' && pattern[i - 2] == '['));
    } else if (c == '[') {
      in_brackets = true;
    } else if (c == '(' || c == ')') {
      depth += c == '(' ? 1 : -1;
    } else if (c == '.' && depth == 0 && i + 1 < pattern.size() && pattern[i + 1] == '*') {
      parts.emplace_back();
      ++i;
      continue;
    }
    parts.back() += c;
  }
  return parts;
}

// pattern A.*B.*C as: A found, then B after it, then C after that. (One std::regex over the
// whole output would match each ".*" by a recursion as deep as the text it spans, which
// overflows the stack on a long output under AddressSanitizer's larger frames.)
inline bool matches(const AppRun& run, const std::string& pattern) {
  auto from = run.output.cbegin();
  for (const std::string& part : split_at_any(pattern)) {
    if (part.empty()) continue;
    std::smatch m;
    if (!std::regex_search(from, run.output.cend(), m, std::regex(cmake_regex(part))))
      return false;
    from = m[0].second;
  }
  return true;
}

}  // namespace clustr::test

// Checks on the AppRun `run`; a failure prints the command line, the exit status and the output.
#define CHECK_RUN(run, cond)                            \
  do {                                                  \
    INFO("command: " << (run).command);                 \
    INFO("exit status: " << (run).status);              \
    INFO("output:\n" << (run).output);                  \
    CHECK(cond);                                        \
  } while (false)
// The output holds text (a plain substring).
#define CHECK_OUTPUT_HAS(run, text) CHECK_RUN(run, clustr::test::contains(run, text))
// The output matches a pattern (as the CMake test had it: '.' matches a newline too).
#define CHECK_OUTPUT_MATCHES(run, pattern) CHECK_RUN(run, clustr::test::matches(run, pattern))
#define CHECK_STATUS(run, expected) CHECK_RUN(run, (run).status == (expected))
// A run that must fail: the output holds text and the status is 1 (CHECK_FAILS_WITH) or any
// non-zero one (CHECK_FAILS).
#define CHECK_FAILS_WITH(run_expr, text)        \
  do {                                          \
    const ::clustr::test::AppRun r_ = run_expr; \
    CHECK_OUTPUT_HAS(r_, text);                 \
    CHECK_STATUS(r_, 1);                        \
  } while (false)
#define CHECK_FAILS(run_expr, text)             \
  do {                                          \
    const ::clustr::test::AppRun r_ = run_expr; \
    CHECK_OUTPUT_HAS(r_, text);                 \
    CHECK_RUN(r_, r_.status != 0);              \
  } while (false)
