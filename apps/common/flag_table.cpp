// An app's settings declared once (flag_table.h).
#include "apps/common/flag_table.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace clustr {

namespace {

std::string printed(double v, int digits) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

[[noreturn]] void malformed(const std::string& key, const std::string& text, const char* what) {
  throw Error(detail::cat("checkpoint config '", key, "' is \"", text, "\", not ", what));
}

long long parse_integer(const std::string& key, const std::string& text, long long lo,
                        long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || v < lo || v > hi)
    malformed(key, text, "an integer");
  return v;
}

double parse_number(const std::string& key, const std::string& text) {
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0') malformed(key, text, "a number");
  return v;
}

}  // namespace

std::string exact_text(float v) {
  for (int digits = 6;; ++digits) {
    std::string s = printed(double(v), digits);
    if (digits >= 9 || std::strtof(s.c_str(), nullptr) == v) return s;
  }
}

std::string exact_text(double v) {
  for (int digits = 15;; ++digits) {
    std::string s = printed(v, digits);
    if (digits >= 17 || std::strtod(s.c_str(), nullptr) == v) return s;
  }
}

FlagTable& FlagTable::push(Entry e) {
  CLUSTR_CHECK(!has(e.name), "FlagTable: --", e.name, " is declared twice");
  entries_.push_back(std::move(e));
  return *this;
}

FlagTable::Entry& FlagTable::last() {
  CLUSTR_CHECK(!entries_.empty(), "FlagTable: a modifier before any entry");
  return entries_.back();
}

const FlagTable::Entry* FlagTable::find(const std::string& name) const {
  for (const Entry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

bool FlagTable::has(const std::string& name) const { return find(name) != nullptr; }

// The plain types: CLI11 binds the field itself; text round-trips through `print`/`parse`.
#define CLUSTR_PLAIN_ENTRY(print, parse)                                                       \
  Entry e;                                                                                     \
  e.name = name;                                                                               \
  e.help = help;                                                                               \
  e.get = [&field] { return print; };                                                          \
  e.set = [&field, name](const std::string& text) { field = parse; };                          \
  e.add = [&field](CLI::App& app, const Entry& self) {                                         \
    app.add_option("--" + self.name, field, self.help)->capture_default_str();                 \
  };                                                                                           \
  return push(std::move(e))

FlagTable& FlagTable::add(const std::string& name, int& field, const std::string& help) {
  CLUSTR_PLAIN_ENTRY(std::to_string(field),
                     static_cast<int>(parse_integer(name, text, INT_MIN, INT_MAX)));
}

FlagTable& FlagTable::add(const std::string& name, int64_t& field, const std::string& help) {
  CLUSTR_PLAIN_ENTRY(std::to_string(field), parse_integer(name, text, LLONG_MIN, LLONG_MAX));
}

FlagTable& FlagTable::add(const std::string& name, uint64_t& field, const std::string& help) {
  CLUSTR_PLAIN_ENTRY(std::to_string(field), [&] {
    char* end = nullptr;
    errno = 0;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (text.empty() || text[0] == '-' || *end != '\0' || errno != 0)
      malformed(name, text, "an integer");
    return static_cast<uint64_t>(v);
  }());
}

FlagTable& FlagTable::add(const std::string& name, float& field, const std::string& help) {
  CLUSTR_PLAIN_ENTRY(exact_text(field), static_cast<float>(parse_number(name, text)));
}

FlagTable& FlagTable::add(const std::string& name, double& field, const std::string& help) {
  CLUSTR_PLAIN_ENTRY(exact_text(field), parse_number(name, text));
}

FlagTable& FlagTable::add(const std::string& name, std::string& field, const std::string& help) {
  CLUSTR_PLAIN_ENTRY(field, text);
}

#undef CLUSTR_PLAIN_ENTRY

FlagTable& FlagTable::add(const std::string& name, bool& field, const std::string& help) {
  Entry e;
  e.name = name;
  e.help = help;
  e.get = [&field] { return std::string(field ? "true" : "false"); };
  e.set = [&field, name](const std::string& text) {
    if (text != "true" && text != "false") malformed(name, text, "true or false");
    field = text == "true";
  };
  e.add = [&field](CLI::App& app, const Entry& self) {
    app.add_flag("--" + self.name, field, self.help);
  };
  return push(std::move(e));
}

FlagTable& FlagTable::add_text(const std::string& name, std::function<std::string()> print,
                               std::function<void(const std::string&)> parse,
                               const std::string& help) {
  Entry e;
  e.name = name;
  e.help = help;
  e.get = print;
  e.set = parse;
  e.add = [print, parse](CLI::App& app, const Entry& self) {
    app.add_option_function<std::string>("--" + self.name, parse, self.help)
        ->default_str(print());
  };
  return push(std::move(e));
}

FlagTable& FlagTable::at_least(double lo) {
  Entry& e = last();
  const auto get = e.get;
  const std::string name = e.name;
  e.checks.push_back([get, name, lo] {
    const std::string v = get();
    CLUSTR_CHECK(std::strtod(v.c_str(), nullptr) >= lo, "--", name, " must be >= ",
                 exact_text(lo), ", got ", v);
  });
  return *this;
}

FlagTable& FlagTable::within(double lo, double hi) {
  Entry& e = last();
  const auto get = e.get;
  const std::string name = e.name;
  e.checks.push_back([get, name, lo, hi] {
    const std::string v = get();
    const double x = std::strtod(v.c_str(), nullptr);
    CLUSTR_CHECK(x >= lo && x <= hi, "--", name, " must be in [", exact_text(lo), ", ",
                 exact_text(hi), "], got ", v);
  });
  return *this;
}

FlagTable& FlagTable::one_of(const std::vector<std::string>& values) {
  Entry& e = last();
  const auto get = e.get;
  const std::string name = e.name;
  std::string listed;
  for (size_t i = 0; i < values.size(); ++i)
    listed += (i == 0 ? "" : i + 1 == values.size() ? " or " : ", ") + values[i];
  e.checks.push_back([get, name, values, listed] {
    const std::string v = get();
    for (const std::string& ok : values)
      if (v == ok) return;
    throw Error(detail::cat("--", name, " must be ", listed, ", got '", v, "'"));
  });
  return *this;
}

FlagTable& FlagTable::check(std::function<bool()> ok, const std::string& expected,
                            bool show_value) {
  Entry& e = last();
  const auto get = e.get;
  const std::string name = e.name;
  e.checks.push_back([get, name, ok, expected, show_value] {
    if (ok()) return;
    throw Error(show_value ? detail::cat("--", name, " ", expected, ", got ", get())
                           : detail::cat("--", name, " ", expected));
  });
  return *this;
}

FlagTable& FlagTable::resume(Resume r) {
  last().resume = r;
  return *this;
}

FlagTable& FlagTable::not_stored() {
  last().stored = false;
  return *this;
}

FlagTable& FlagTable::when_absent(const std::string& value) {
  last().when_absent = value;
  return *this;
}

void FlagTable::add_to(CLI::App& app, const std::set<std::string>& skip) const {
  for (const Entry& e : entries_)
    if (!skip.count(e.name)) e.add(app, e);
}

void FlagTable::validate() const {
  for (const Entry& e : entries_)
    for (const auto& c : e.checks) c();
}

std::vector<std::pair<std::string, std::string>> FlagTable::entries() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Entry& e : entries_)
    if (e.stored) out.emplace_back(e.name, e.get());
  return out;
}

std::map<std::string, std::string> FlagTable::config() const {
  const auto list = entries();
  return {list.begin(), list.end()};
}

void FlagTable::apply(const std::map<std::string, std::string>& config,
                      const std::vector<std::string>& keys) {
  for (const std::string& key : keys) {
    const Entry* e = find(key);
    CLUSTR_CHECK(e, "FlagTable: no setting '", key, "'");
    auto it = config.find(key);
    if (it != config.end()) {
      e->set(it->second);
      continue;
    }
    CLUSTR_CHECK(!e->when_absent.empty(), "checkpoint config lacks '", key, "'");
    e->set(e->when_absent);
  }
}

void FlagTable::set(const std::string& assignments) {
  std::istringstream in(assignments);
  for (std::string item; in >> item;) {
    const size_t eq = item.find('=');
    CLUSTR_CHECK(eq != std::string::npos && eq > 0, "FlagTable: '", item, "' is not name=value");
    const Entry* e = find(item.substr(0, eq));
    CLUSTR_CHECK(e, "FlagTable: no setting '", item.substr(0, eq), "'");
    e->set(item.substr(eq + 1));
  }
}

std::vector<std::string> FlagTable::keys(Resume r) const {
  std::vector<std::string> out;
  for (const Entry& e : entries_)
    if (e.stored && e.resume == r) out.push_back(e.name);
  return out;
}

std::vector<std::string> config_differences(const std::map<std::string, std::string>& saved,
                                            const std::map<std::string, std::string>& now,
                                            const std::vector<std::string>& keys) {
  std::vector<std::string> out;
  for (const std::string& k : keys) {
    auto a = saved.find(k), b = now.find(k);
    const std::string va = a == saved.end() ? "(absent)" : a->second;
    const std::string vb = b == now.end() ? "(absent)" : b->second;
    if (va != vb) out.push_back(detail::cat("--", k, ": checkpoint ", va, ", now ", vb));
  }
  return out;
}

}  // namespace clustr
