// Integer flags within their type's range, and parsing that names an out-of-range switch value
// (flags.h).
#include "apps/common/flags.h"

#include <CLI/CLI.hpp>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <string>

#include "core/error.h"

namespace clustr {

namespace {

void check_value(const CLI::Option& o, const std::string& text, bool is_unsigned) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  const bool negative = i < text.size() && text[i] == '-';
  errno = 0;
  char* end = nullptr;
  if (is_unsigned) {
    std::strtoull(text.c_str(), &end, 0);
    CLUSTR_CHECK(!negative && errno != ERANGE, o.get_name(), " ", text,
                 ": expected a whole number from 0 to ",
                 std::numeric_limits<uint64_t>::max());
  } else {
    std::strtoll(text.c_str(), &end, 0);
    CLUSTR_CHECK(errno != ERANGE, o.get_name(), " ", text, ": out of range (a whole number from ",
                 std::numeric_limits<int64_t>::min(), " to ",
                 std::numeric_limits<int64_t>::max(), ")");
  }
}

}  // namespace

void check_integer_flags(const CLI::App& app) {
  for (const CLI::Option* o : app.get_options()) {
    const std::string type = o->get_type_name();
    if (type != "INT" && type != "UINT") continue;
    for (const std::string& text : o->results()) check_value(*o, text, type == "UINT");
  }
  for (const CLI::App* sub : app.get_subcommands({})) check_integer_flags(*sub);
}

void parse_flags(CLI::App& app, int argc, const char* const* argv) {
  try {
    app.parse(argc, argv);
  } catch (const std::out_of_range& e) {
    // The argument: a value after '=' that is a whole number past the 64-bit range.
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      const size_t eq = arg.find('=');
      if (arg.rfind("-", 0) != 0 || eq == std::string::npos) continue;
      const std::string value = arg.substr(eq + 1);
      const size_t sign = !value.empty() && (value[0] == '+' || value[0] == '-') ? 1 : 0;
      if (value.size() == sign || value.find_first_not_of("0123456789", sign) != std::string::npos)
        continue;
      errno = 0;
      std::strtoll(value.c_str(), nullptr, 10);
      if (errno == ERANGE)
        throw Error(detail::cat(arg.substr(0, eq), " ", value,
                                ": out of range (a switch takes no value, or a count from ",
                                std::numeric_limits<int64_t>::min(), " to ",
                                std::numeric_limits<int64_t>::max(), ")"));
    }
    throw Error(detail::cat("a value on the command line is out of range (", e.what(), ")"));
  }
}

int parse_or_exit(CLI::App& app, int argc, const char* const* argv) {
  try {
    parse_flags(app, argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return -1;
}

}  // namespace clustr
