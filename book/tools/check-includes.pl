#!/usr/bin/env perl
# An mdBook preprocessor that runs after `links` and fails the build when an include
# was not resolved. mdBook only logs a missing {{#include}} file and exits 0, and an
# anchor that does not exist silently includes nothing; both must break the build.
# It also dedents code blocks, since mdBook keeps an anchored item's indentation.
use strict;
use warnings;
use JSON::PP;

# `mdbook` first asks whether we support a renderer: we support all of them.
exit 0 if @ARGV && $ARGV[0] eq 'supports';

local $/;
my $input = <STDIN>;
my $json = JSON::PP->new->utf8->canonical;
my ($ctx, $book) = @{ $json->decode($input) };

my @problems;
sub walk {
    my ($items) = @_;
    for my $item (@$items) {
        next unless ref $item eq 'HASH' && exists $item->{Chapter};
        my $ch = $item->{Chapter};
        my $where = $ch->{source_path} // $ch->{name};
        my $content = $ch->{content} // '';
        # An include the links preprocessor could not resolve is left in place.
        while ($content =~ /(\{\{#(?:include|rustdoc_include)[^}]*\}\})/g) {
            push @problems, "$where: unresolved $1";
        }
        # An include of a missing anchor leaves an empty code block behind. While
        # walking the code blocks, also remove the indentation an anchor inside an
        # `impl` brings along (only for fences at the margin: a fence inside a list
        # item needs its indentation).
        my (@out, $fence, $info, $margin, @body);
        for my $line (split /\n/, $content, -1) {
            if (!defined $fence) {
                push @out, $line;
                if ($line =~ /^(\s*)(```+)(.*)$/) {
                    ($margin, $fence, $info, @body) = ($1 eq '', $2, $3);
                }
            } elsif ($line =~ /^\s*\Q$fence\E\s*$/) {
                my @text = grep { /\S/ } @body;
                push @problems, "$where: empty code block ```$info (missing anchor?)" unless @text;
                if ($margin && @text) {
                    my ($min) = sort { $a <=> $b } map { /^( *)/; length $1 } @text;
                    s/^ {0,$min}// for @body;
                }
                push @out, @body, $line;
                undef $fence;
            } else {
                push @body, $line;
            }
        }
        push @out, @body if defined $fence;
        $ch->{content} = join "\n", @out;
        walk($ch->{sub_items} // []);
    }
}
walk($book->{items} // $book->{sections} // []);

if (@problems) {
    print STDERR "check-includes: $_\n" for @problems;
    exit 1;
}
print $json->encode($book);
