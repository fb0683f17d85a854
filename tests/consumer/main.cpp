// A project outside cqk's tree that links the installed library.
#include <cqk/build_info.h>
#include <cqk/runtime.h>

#include <iostream>

int main() {
  cqk::configure_threads(1);
  std::cout << cqk::describe(cqk::build_info());
  return 0;
}
