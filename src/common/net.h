// The host's network interfaces, as workers' collective libraries name them.
#pragma once

#include <string>
#include <string_view>

namespace endure {

// The name of the interface that holds `address` (an IPv4 or IPv6 address
// in text form, e.g. "10.0.0.7"), e.g. "eth0"; "" when no interface of this
// host (network namespace) holds it or `address` is not an address.
std::string InterfaceWithAddress(std::string_view address);

}  // namespace endure
