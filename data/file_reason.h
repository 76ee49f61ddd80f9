// Why a path cannot be read as a regular file, in words a user can act on: the file is
// missing, is a folder, a FIFO, a device or a socket, or the system refused it (the errno text,
// e.g. "Permission denied"). The readers of manifests, tokens and audio put it in their errors.
#pragma once

#include <string>

namespace clustr {

// "" when `path` is a regular file this process can open for reading, else the reason:
// "does not exist", "is a folder, not a file", "is a FIFO (named pipe), not a file",
// "is a device, not a file", "is a socket, not a file", or the system's reason.
std::string unreadable_reason(const std::string& path);

// `text` without a leading UTF-8 byte-order mark (EF BB BF), which some editors write.
std::string without_bom(const std::string& text);

}  // namespace clustr
