// The one file the builder compiles (kernels/builder.py): every kernel file
// of this folder, included in turn, makes the library one translation unit.
// TensorFlow's framework headers take most of a build's time; compiled file
// by file, they would be parsed once for each file, which about triples the
// time of a build.

#include "common.cc"
#include "gradients.cc"
#include "initialize.cc"
#include "inputs.cc"
#include "lookup.cc"
#include "routing.cc"
#include "updates.cc"
