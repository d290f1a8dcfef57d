#include "common/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <cstring>

namespace endure {

std::string InterfaceWithAddress(std::string_view address) {
  const std::string text(address);
  in_addr v4{};
  in6_addr v6{};
  const bool is_v4 = inet_pton(AF_INET, text.c_str(), &v4) == 1;
  const bool is_v6 = !is_v4 && inet_pton(AF_INET6, text.c_str(), &v6) == 1;
  if (!is_v4 && !is_v6) return "";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* i = list; i != nullptr && name.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr) continue;
    if (is_v4 && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == v4.s_addr) {
      name = i->ifa_name;
    } else if (is_v6 && i->ifa_addr->sa_family == AF_INET6 &&
               std::memcmp(&reinterpret_cast<sockaddr_in6*>(i->ifa_addr)->sin6_addr, &v6,
                           sizeof v6) == 0) {
      name = i->ifa_name;
    }
  }
  freeifaddrs(list);
  return name;
}

}  // namespace endure
