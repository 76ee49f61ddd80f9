// Checks of the command line that CLI11 (2.1) leaves out: it reads "-1" into an unsigned flag
// as 18446744073709551615 and a number past the 64-bit range as the nearest limit, silently.
#pragma once

namespace CLI {
class App;
}

namespace clustr {

// After parsing: every value given to an integer flag of `app` or of its subcommands must be a
// whole number within the flag's type (no minus sign for an unsigned one, nothing past 64
// bits). Throws clustr::Error naming the flag, the value and the range.
void check_integer_flags(const CLI::App& app);

}  // namespace clustr
