// Two targets of one project linking gpt2::attention: this program and the shared library
// consumer_plugin (plugin.cpp), each with its copy of the compiled library. It links (no duplicate
// symbols) and both forwards give the same bits from the same random draws.
#include <gpt2/attention.hpp>

#include <cstdio>
#include <cstdlib>

#include "../common/small_model.hpp"

gpt2::RowMatrix<float> plugin_forward();

int main() {
  std::srand(11);
  const gpt2::RowMatrix<float> mine = consumer::small_forward();
  std::srand(11);
  const gpt2::RowMatrix<float> plugin = plugin_forward();
  if (consumer::check_output(plugin, "two-targets consumer (plugin)") != 0) return 1;
  if (mine != plugin) {
    std::fprintf(stderr, "two-targets consumer: the program and the plugin differ\n");
    return 1;
  }
  std::printf("two-targets consumer: the program and the shared library agree bitwise\n");
  return 0;
}
