#!/usr/bin/perl
# Turns a .cu file into C++ the emulator compiles (tests/gpu/emulator/emulator.h), keeping every
# line where it was, so compiler messages point into the .cu file:
#   kernel<<<grid, block[, smem[, stream]]>>>(args)
#       -> emu_launch(emu_config(grid, block[, smem[, stream]]), "kernel", kernel, args)
#   extern __shared__ [__align__(N)] T name[];   -> T *name = (T *)emu_dynamic_shared();
#       (the emulator's dynamic shared memory is 1024-byte aligned, more than any N asks)
use strict;
use warnings;
local $/;
my $src = <>;
$src =~ s{extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?(\w+)\s+(\w+)\s*\[\s*\]\s*;}{$1 *$2 = ($1 *)emu_dynamic_shared();}g;
my $n = 0;
$src =~ s{(\b[A-Za-z_]\w*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*(\(((?:[^()]++|(?3))*)\))}{
    $n++;
    my ($kernel, $config, $args) = ($1, $2, $4);
    "emu_launch(emu_config($config), \"$kernel\", $kernel" . ($args =~ /\S/ ? ", $args" : "") . ")"
}gse;
die "translate.pl: a <<< >>> launch was not rewritten\n" if $src =~ /<<<|>>>/;
print "#line 1 \"$ARGV\"\n", $src;
