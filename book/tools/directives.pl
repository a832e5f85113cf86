#!/usr/bin/env perl
# An mdBook preprocessor for the translated edition, run after gettext: puts back the
# directives ({{#figure …}}, {{#include …}}) exactly as the English source writes them.
# The translation tools carry each paragraph through a Markdown parser and back, which
# rewrites the punctuation of a directive's text as if it were prose: a regular
# expression's `[`, `]` and `\` gain escapes, a pair of `*` becomes `_`. A directive of
# the translation is replaced by the directive of the English chapter that reads the same
# once backslashes are dropped and `*` is read as `_`; one that matches no English
# directive, or several different ones, is left as it is, for the figures and includes
# checks to report.
use strict;
use warnings;
use JSON::PP;
use File::Spec;

exit 0 if @ARGV && $ARGV[0] eq 'supports';

local $/;
my $input = <STDIN>;
my $json = JSON::PP->new->utf8->canonical;
my ($ctx, $book) = @{ $json->decode($input) };
my $src = File::Spec->catdir($ctx->{root}, $ctx->{config}{book}{src} // 'src');

# A directive as the translation tools may have rewritten it: without backslashes, and
# with `_` for `*` (emphasis).
sub signature { my ($d) = @_; $d =~ s/\\//g; $d =~ tr/*/_/; return $d }

sub restore {
    my ($content, $path) = @_;
    my $file = File::Spec->catfile($src, $path);
    open my $fh, '<:encoding(UTF-8)', $file or return $content;
    my $english = <$fh>;
    close $fh;
    my %by;
    for my $d ($english =~ /(\{\{#[^}]*\}\})/g) {
        $by{ signature($d) }{$d} = 1;
    }
    my %exact = map { %$_ } values %by;
    my @lines = split /\n/, $content, -1;
    for my $line (@lines) {
        my $row = $line =~ /^\s*\|/;
        $line =~ s/(\{\{#[^}]*\}\})/pick($1, $row, \%exact, \%by)/ge;
    }
    return join "\n", @lines;
}

# The English directive a translated one stands for. Where two read the same (a table
# row escapes its pipes, a sentence does not), the one of the same kind of line.
sub pick {
    my ($d, $row, $exact, $by) = @_;
    return $d if $exact->{$d};
    my @same = sort keys %{ $by->{ signature($d) } // {} };
    @same = grep { ($row ? !/(?<!\\)\|/ : /(?<!\\)\|/) } @same if @same > 1;
    return @same == 1 ? $same[0] : $d;
}

sub walk {
    my ($items) = @_;
    for my $item (@$items) {
        next unless ref $item eq 'HASH' && exists $item->{Chapter};
        my $ch = $item->{Chapter};
        $ch->{content} = restore($ch->{content} // '', $ch->{source_path})
            if defined $ch->{source_path};
        walk($ch->{sub_items} // []);
    }
}
walk($book->{items} // $book->{sections} // []);
print $json->encode($book);
