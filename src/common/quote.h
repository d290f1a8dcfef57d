// Writing a string between double quotes with the escapes that TOML basic
// strings, JSON and Endure's own text formats (the job codec) share: \" \\
// \n \t, and a control character as \xNN or \uNNNN.
#pragma once

#include <string>
#include <string_view>

namespace endure {

enum class ControlEscape {
  kHexByte,  // \x1f (the job codec's journal lines)
  kUnicode,  // \u001f (TOML, JSON)
};

// Appends `s` to `out`, quoted. Bytes >= 0x80 are copied as they are.
void AppendQuoted(std::string_view s, ControlEscape style, std::string& out);

}  // namespace endure
