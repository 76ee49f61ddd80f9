// The file side of an app's metrics.csv, shared by the apps' MetricsLog classes: reading the
// rows to keep when a run resumes, rewriting the file atomically, appending a row. I/O errors
// carry the system's reason.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace clustr {

// The lines after the header of the metrics file at `path` (none when it does not exist).
// A last line without its newline was cut short (the run was killed, or the disk was full,
// while writing it): it is dropped with a note on `log` (nullptr: silent), since it lies past
// any checkpoint. Throws when the first line is not `header`.
std::vector<std::string> read_metrics_rows(const std::string& path, const std::string& header,
                                           std::FILE* log);
// Writes the header and the rows to `path` through a temporary file renamed over it.
void write_metrics_file(const std::string& path, const std::string& header,
                        const std::vector<std::string>& rows);
// Writes `lines` (each with its newline) to `path` through a temporary file renamed over it.
void write_lines_atomically(const std::string& path, const std::vector<std::string>& lines);
// Appends one row (and its newline) to `path`.
void append_metrics_row(const std::string& path, const std::string& row);

}  // namespace clustr
