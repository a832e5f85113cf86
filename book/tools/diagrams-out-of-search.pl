#!/usr/bin/env perl
# An mdBook preprocessor that runs after `mermaid` and keeps diagram source out of the
# search index. mdbook-mermaid turns each ```mermaid block into
# <pre class="mermaid">SOURCE</pre>, and mdBook indexes the text of that element like
# prose, so search teasers showed "flowchart TD ... -->". mdBook's indexer skips the
# contents of <script> elements, so the source moves into
# <script type="text/plain" class="mermaid-source">, and mermaid-source.js (loaded
# before mermaid-init.js) turns it back into the <pre class="mermaid"> mermaid renders.
# Doing it here, rather than by editing the built search index, keeps `mdbook serve`
# and `mdbook build` alike. The source stays HTML-escaped as mdbook-mermaid wrote it,
# which also means it can never contain "</script>".
use strict;
use warnings;
use JSON::PP;

exit 0 if @ARGV && $ARGV[0] eq 'supports';

local $/;
my $json = JSON::PP->new->utf8->canonical;
my ($ctx, $book) = @{ $json->decode(scalar <STDIN>) };

sub walk {
    my ($items) = @_;
    for my $item (@$items) {
        next unless ref $item eq 'HASH' && exists $item->{Chapter};
        my $ch = $item->{Chapter};
        $ch->{content} =~ s{<pre class="mermaid">(.*?)</pre>}
                           {<script type="text/plain" class="mermaid-source">$1</script>}gs
            if defined $ch->{content};
        walk($ch->{sub_items} // []);
    }
}
walk($book->{items} // $book->{sections} // []);
print $json->encode($book);
