#!/usr/bin/env perl
# An mdBook preprocessor for a translated edition, run after gettext, that undoes two
# rewrites of the translation tools, which carry each paragraph through a Markdown
# parser and back:
#
# - Emphasis comes back as `_text_`, which CommonMark does not read as emphasis between
#   Chinese characters (an underscore inside a word is a letter): it is written `*text*`
#   again, outside code.
# - A directive's text ({{#figure …}}, {{#include …}}) is rewritten as if it were prose:
#   a regular expression's `[`, `]` and `\` gain escapes, a pair of `*` becomes `_`. Each
#   is put back exactly as the English source writes it. A directive of
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

# `_text_` emphasis as `*text*`, outside code spans, fenced blocks, directives, link
# targets and HTML tags; an underscore inside a word (memory_allocated) is no emphasis.
sub stars {
    my ($content) = @_;
    my ($fence, @out);
    for my $line (split /\n/, $content, -1) {
        if ($line =~ /^\s*(```+|~~~+)/) {
            $fence = defined $fence && $line =~ /^\s*\Q$fence\E\s*$/ ? undef : ($fence // $1);
            push @out, $line;
            next;
        }
        if (defined $fence) {
            push @out, $line;
            next;
        }
        my @parts = split /((`+).*?\2|\{\{#[^}]*\}\}|\]\([^)]*\)|<[^>]+>)/, $line;
        my $text = '';
        while (@parts) {
            my $t = shift @parts;
            $t =~ s/(?<![A-Za-z0-9_`\\])_(?=\S)([^_`{}]*?\S)_(?![A-Za-z0-9_])/*$1*/g;
            $text .= $t;
            last unless @parts;
            my $protected = shift @parts;
            shift @parts;    # the backticks' own capture
            $text .= $protected // '';
        }
        push @out, $text;
    }
    return join "\n", @out;
}

sub walk {
    my ($items) = @_;
    for my $item (@$items) {
        next unless ref $item eq 'HASH' && exists $item->{Chapter};
        my $ch = $item->{Chapter};
        $ch->{content} = stars(restore($ch->{content} // '', $ch->{source_path}))
            if defined $ch->{source_path};
        walk($ch->{sub_items} // []);
    }
}
# The English edition is its source, which nothing rewrote.
my $language = $ctx->{config}{book}{language} // 'en';
walk($book->{items} // $book->{sections} // []) unless $language eq 'en';
print $json->encode($book);
