// Checks of the command line that CLI11 (2.1) leaves out: it reads "-1" into an unsigned flag
// as 18446744073709551615 and a number past the 64-bit range as the nearest limit, silently,
// and a switch's value past that range throws an exception it does not name.
#pragma once

namespace CLI {
class App;
}

namespace clustr {

// After parsing: every value given to an integer flag of `app` or of its subcommands must be a
// whole number within the flag's type (no minus sign for an unsigned one, nothing past 64
// bits). Throws clustr::Error naming the flag, the value and the range.
void check_integer_flags(const CLI::App& app);

// app.parse(argc, argv), with the one conversion of CLI11 (2.1) that escapes its own errors
// made a clear error: a switch given a number past 64 bits ("--no-plots=99999999999999999999",
// which CLI11 reads as a count with std::stoll) throws std::out_of_range there, and the program
// would say only "stoll". Throws CLI::ParseError as app.parse does (the caller prints it with
// app.exit), or clustr::Error naming the argument.
void parse_flags(CLI::App& app, int argc, const char* const* argv);
// CLI11_PARSE's twin over parse_flags: -1 when the program goes on, else the status to return
// (CLI11 has printed the help, the version or the parse error).
int parse_or_exit(CLI::App& app, int argc, const char* const* argv);

}  // namespace clustr
