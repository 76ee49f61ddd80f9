// Integer flags within their type's range (flags.h).
#include "apps/common/flags.h"

#include <CLI/CLI.hpp>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <limits>
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

}  // namespace clustr
