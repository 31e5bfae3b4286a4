#include "tools/hp_launch/launcher.h"

int main(int argc, char** argv) { return hp::launch::run_cli(argc, argv); }
