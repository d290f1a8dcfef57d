// Status and Result<T> are part of the public client API: their definition
// lives in include/endure/status.h, so that programs that link the client
// library use the same types as Endure's own code.
#pragma once

#include "endure/status.h"
