// CSV fields as training tables (data.kind = csv) and predict's .csv input read them: fields
// separated by commas, a field may be quoted ("..."), spaces around a field are ignored. The
// caller strips the line ending ("\n" or "\r\n").
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace tessel::data {

// The fields of one line, unquoted and trimmed.
std::vector<std::string> csv_fields(const std::string& line);

// A field as a number (any form strtod reads: 3, -0.5, 1e-3, nan); nullopt when it is empty or
// not wholly a number.
std::optional<double> csv_number(const std::string& field);

}  // namespace tessel::data
