#!/usr/bin/env perl
# An mdBook preprocessor that makes the labs' outputs readable in the book's column. An
# output reaches a chapter as a ```text block ({{#include ../outputs/...}} inside the
# fence); this runs after `links` (so the includes are expanded) and turns each such block
# into HTML, part by part, keeping every cell's text as the lab printed it:
#
#   - a table becomes an HTML table (a header row; numbers right-aligned) that scrolls
#     sideways inside its own box when it is wider than the column:
#       a `| a | b |` table whose header a Markdown separator (`| --- | --- |`) follows;
#       lines whose cells are separated by two spaces or more, under a header line of
#       three cells or more. Each cell of a row belongs to the header cell it lies under,
#       so a label with single spaces stays one cell, and two cells one space apart are
#       told apart where the space falls between two header cells. Such lines with no
#       header (its first line holds numbers, or only two columns: names and values)
#       become a table without a header row only when they are too wide for the column;
#       otherwise they stay text;
#   - a command line (`$ ...`) is shown as a shell command: a trailing `# comment` (the
#     device it ran on) goes on its own line above it, and a command longer than $MAX
#     characters is broken at spaces with ` \` continuations (an option stays with its
#     value);
#   - a JSON line (it starts with `{`, parses, and is longer than $MAX characters) becomes
#     a table of its values by path: a.b.c; an array of numbers is one value; an array
#     of objects is indexed by a field that tells its elements apart, a[bytes=1024].x, as
#     {{#figure}} keys select them (tools/figures.pl), or else by position, a[0].x;
#   - any other line stays preformatted and unwrapped when it fits in $MAX characters;
#     a longer one is prose (a title, a note, an error message) and wraps like prose.
#
# Blank lines separate the parts. Every other code block (rust, python, sh) is left as it
# is. The HTML has no blank line, so that Markdown takes it as one HTML block; mdBook's
# search index reads its text, and print.html is built from the same content.
#
# `perl outputs.pl test` runs the self-test; `perl outputs.pl show FILE.txt` prints the
# HTML one output file becomes.
use strict;
use warnings;
use utf8;
use JSON::PP;

binmode STDOUT, ':encoding(UTF-8)' if @ARGV && $ARGV[0] =~ /^(show|test)$/;
binmode STDERR, ':encoding(UTF-8)';

# The widest line, in characters, that a <pre> may hold: the book's column (750 px, less
# the code block's padding) holds about 86 characters of its monospace font at desktop
# size, and a phone (390 px) scrolls at most one screen more for 80.
our $MAX = 80;
# A table's cells stay on one line, but for text longer than this, which wraps.
our $WRAP = 24;

sub esc {
    my ($s) = @_;
    $s =~ s/&/&amp;/g;
    $s =~ s/</&lt;/g;
    $s =~ s/>/&gt;/g;
    $s =~ s/"/&quot;/g;
    return $s;
}

# ---------------------------------------------------------------- cells and numbers

# A cell that reads as a number (possibly with a sign, a unit or a percent, or a ratio
# such as 105/5/0/0), which the table right-aligns.
sub is_number {
    my ($s) = @_;
    return $s =~ m{^[+\-−±~≈]?(?:\d[\d,_]*(?:\.\d+)?|\.\d+)(?:[eE][+-]?\d+)?
                   (?:/\d[\d.,]*)*
                   (?:\s?(?:%|x|×|[A-Za-zµ]{1,4}(?:/s)?))?$}x;
}

# A cell that says "nothing here" in a column of numbers.
sub is_blank_number { $_[0] =~ /^(?:|-|–|—|n\/a|·)$/ }

# Which columns of the body rows hold numbers (most of their non-empty cells).
sub numeric_columns {
    my ($ncol, $rows) = @_;
    my @right;
    for my $c (0 .. $ncol - 1) {
        my ($num, $text) = (0, 0);
        for my $r (@$rows) {
            my $v = $r->[$c] // '';
            next if is_blank_number($v);
            is_number($v) ? $num++ : $text++;
        }
        push @right, ($num > 0 && $num >= $text) ? 1 : 0;
    }
    return \@right;
}

# The cells of a line separated by two spaces or more, with where each starts and ends
# (character positions, inclusive).
sub tokens {
    my ($line) = @_;
    my @t;
    while ($line =~ /(\S+(?: \S+)*)/g) {
        push @t, [$-[1], $+[1] - 1, $1];
    }
    return @t;
}

# ---------------------------------------------------------------- tables

sub table_html {
    my (%a) = @_;    # header => [..] or undef, rows => [[..]], class => '...'
    my $ncol = $a{header} ? scalar @{ $a{header} } : 0;
    $ncol < @$_ and $ncol = @$_ for @{ $a{rows} };
    my $right = numeric_columns($ncol, $a{rows});
    my $cell = sub {
        my ($tag, $c, $text) = @_;
        $text //= '';
        my @class;
        my $html = esc($text);
        if ($right->[$c] && ($tag eq 'th' || is_number($text) || is_blank_number($text))) {
            push @class, 'num';
        } elsif (length($text) > $WRAP) {
            # A long cell of text wraps, at spaces only: a word with a hyphen or a path
            # (pytorch-train.py:297) stays whole.
            push @class, 'wrap';
            $html =~ s{(\S*[-/]\S*)}{<span class="word">$1</span>}g;
        }
        my $cls = @class ? qq{ class="@class"} : '';
        return "<$tag$cls>$html</$tag>";
    };
    my @h = (qq{<div class="table-wrapper output-table"><table class="${\ ($a{class} // 'output')}">});
    if ($a{header}) {
        push @h, '<thead><tr>' . join('', map { $cell->('th', $_, $a{header}[$_]) } 0 .. $ncol - 1)
            . '</tr></thead>';
    }
    push @h, '<tbody>';
    for my $r (@{ $a{rows} }) {
        push @h, '<tr>' . join('', map { $cell->('td', $_, $r->[$_]) } 0 .. $ncol - 1) . '</tr>';
    }
    push @h, '</tbody></table></div>';
    return @h;
}

# A Markdown separator has a cell for each column: a rule across a box (`|-----|`) is not one.
sub is_separator { $_[0] =~ /^\s*\|(?:\s*:?-+:?\s*\|){2,}\s*$/ }

sub pipe_cells {
    my ($line) = @_;
    my $t = $line =~ s/^\s*\|//r;
    $t =~ s/\|\s*$//;
    return map { s/^\s+|\s+$//gr } split /\|/, $t, -1;
}

# A `| a | b |` table starting at $i: (lines it takes, html lines), or (0).
sub pipe_table {
    my ($lines, $i, $end) = @_;
    return 0 unless $i + 1 <= $end && is_separator($lines->[$i + 1]) && !is_separator($lines->[$i]);
    my @header = pipe_cells($lines->[$i]);
    my @sep = pipe_cells($lines->[$i + 1]);
    return 0 unless @sep == @header;
    my @rows;
    my $j = $i + 2;
    while ($j <= $end && $lines->[$j] =~ /^\s*\|/ && !is_separator($lines->[$j])) {
        # A row followed by a separator heads the next table.
        last if $j + 1 <= $end && is_separator($lines->[$j + 1]);
        my @c = pipe_cells($lines->[$j]);
        last unless @c == @header;
        push @rows, \@c;
        $j++;
    }
    return ($j - $i, table_html(header => \@header, rows => \@rows));
}

# The cells of one row of a space-aligned table, each under the column it lies below;
# undef when a cell cannot be placed (it spans two columns with no space between them,
# or two cells fall in one column).
sub place_row {
    my ($cols, $line) = @_;
    my @cells = (undef) x @$cols;
    my @queue = tokens($line);
    return unless @queue >= 2;
    while (my $t = shift @queue) {
        my ($s, $e, $text) = @$t;
        my @over = grep { $s <= $cols->[$_][1] && $e >= $cols->[$_][0] } 0 .. $#$cols;
        if (@over > 1) {
            # Split at a single space that falls between the first two columns it spans.
            my ($l, $r) = @over[0, 1];
            my $split;
            for my $p ($cols->[$l][1] + 1 .. $cols->[$r][0] - 1) {
                next unless $p > $s && $p < $e;
                if (substr($text, $p - $s, 1) eq ' ') { $split = $p; last }
            }
            return unless defined $split;
            unshift @queue, [$s, $split - 1, substr($text, 0, $split - $s)],
                [$split + 1, $e, substr($text, $split + 1 - $s)];
            next;
        }
        my $c;
        if (@over == 1) {
            $c = $over[0];
        } else {
            # In the gap between columns: the nearer one.
            my @d = map { $s > $cols->[$_][1] ? $s - $cols->[$_][1] : $cols->[$_][0] - $e } 0 .. $#$cols;
            my @by = sort { $d[$a] <=> $d[$b] } 0 .. $#$cols;
            return if @by > 1 && $d[$by[0]] == $d[$by[1]];
            $c = $by[0];
        }
        return if defined $cells[$c];
        $cells[$c] = $text;
    }
    return \@cells;
}

# A space-aligned table starting at $i: (lines it takes, html lines), or (0).
sub aligned_table {
    my ($lines, $i, $end) = @_;
    my @first = tokens($lines->[$i]);
    return 0 unless @first >= 2;
    my $cols = [map { [$_->[0], $_->[1]] } @first];
    my @rows;
    my $j = $i + 1;
    while ($j <= $end && kind($lines->[$j]) eq 'text') {
        my $cells = place_row($cols, $lines->[$j]) or last;
        push @rows, $cells;
        $j++;
    }
    return 0 unless @rows;
    my @head = map { $_->[2] } @first;
    # The first line names the columns when it has three cells or more, none of them a
    # number, and some column holds numbers in the rows below it. (Two columns are a
    # list of names and values, such as `peak reserved   236.00 MiB`: text.)
    my $right = numeric_columns(scalar @head, \@rows);
    my $header = @head >= 3 && !grep({ is_number($_) } @head) && grep({ $_ } @$right);
    if (!$header) {
        # Rows of a table with no header: a table only when they do not fit as text.
        my $wide = grep { length($lines->[$_]) > $MAX } $i .. $j - 1;
        return 0 unless $wide;
        unshift @rows, [map { $_->[2] } @first];
        return ($j - $i, table_html(header => undef, rows => \@rows));
    }
    return ($j - $i, table_html(header => \@head, rows => \@rows));
}

# ---------------------------------------------------------------- JSON

# A JSON parser that keeps each number as it was printed: [obj => [[k, v]...]],
# [arr => [v...]], [str => text], [raw => text] (numbers, true, false, null).
sub parse_json {
    my ($text) = @_;
    my $pos = 0;
    my $ws = sub { $pos++ while $pos < length($text) && substr($text, $pos, 1) =~ /\s/ };
    my $value;
    my $string = sub {
        pos($text) = $pos;
        $text =~ /\G"((?:[^"\\]|\\.)*)"/gcs or die "string expected at $pos\n";
        $pos = pos($text);
        return JSON::PP->new->allow_nonref->decode(qq{"$1"});
    };
    $value = sub {
        $ws->();
        my $ch = substr($text, $pos, 1);
        if ($ch eq '{') {
            $pos++;
            my @pairs;
            $ws->();
            if (substr($text, $pos, 1) eq '}') { $pos++; return [obj => \@pairs] }
            while (1) {
                $ws->();
                my $k = $string->();
                $ws->();
                substr($text, $pos++, 1) eq ':' or die "':' expected at $pos\n";
                push @pairs, [$k, $value->()];
                $ws->();
                my $c = substr($text, $pos++, 1);
                last if $c eq '}';
                $c eq ',' or die "',' expected at $pos\n";
            }
            return [obj => \@pairs];
        }
        if ($ch eq '[') {
            $pos++;
            my @items;
            $ws->();
            if (substr($text, $pos, 1) eq ']') { $pos++; return [arr => \@items] }
            while (1) {
                push @items, $value->();
                $ws->();
                my $c = substr($text, $pos++, 1);
                last if $c eq ']';
                $c eq ',' or die "',' expected at $pos\n";
            }
            return [arr => \@items];
        }
        return [str => $string->()] if $ch eq '"';
        pos($text) = $pos;
        if ($text =~ /\G(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null)/gc) {
            $pos = pos($text);
            return [raw => $1];
        }
        die "value expected at $pos\n";
    };
    my $v = eval {
        my $r = $value->();
        $ws->();
        die "trailing text\n" if $pos < length $text;
        $r;
    };
    return $v;
}

sub json_text {
    my ($v) = @_;
    my ($kind, $x) = @$v;
    return $x if $kind eq 'raw';
    return JSON::PP->new->allow_nonref->encode($x) if $kind eq 'str';
    return '[' . join(',', map { json_text($_) } @$x) . ']' if $kind eq 'arr';
    return '{' . join(',', map { JSON::PP->new->allow_nonref->encode($_->[0]) . ':' . json_text($_->[1]) } @$x) . '}';
}

# A key as a path step: quoted when it holds anything but a plain name.
sub step { $_[0] =~ /^[A-Za-z0-9_\-]+$/ ? $_[0] : qq{"$_[0]"} }

# [path, value text] for every value of a parsed JSON value.
sub flatten {
    my ($v, $path, $out) = @_;
    my ($kind, $x) = @$v;
    if ($kind eq 'obj') {
        push @$out, [$path, '{}'] unless @$x;
        for my $p (@$x) {
            flatten($p->[1], ($path eq '' ? '' : "$path.") . step($p->[0]), $out);
        }
    } elsif ($kind eq 'arr') {
        my @scalar = grep { $_->[0] eq 'raw' || $_->[0] eq 'str' } @$x;
        if (@scalar == @$x && length(json_text($v)) <= 40) {
            push @$out, [$path, json_text($v)];
            return;
        }
        my $field = distinguishing_field($x);
        for my $n (0 .. $#$x) {
            my $at = defined $field
                ? "[$field=" . field_value($x->[$n], $field) . ']'
                : "[$n]";
            flatten($x->[$n], "$path$at", $out);
        }
        push @$out, [$path, '[]'] unless @$x;
    } elsif ($kind eq 'str') {
        push @$out, [$path, $x eq '' ? '""' : $x];
    } else {
        push @$out, [$path, $x];
    }
}

sub field_value {
    my ($obj, $field) = @_;
    my ($p) = grep { $_->[0] eq $field } @{ $obj->[1] };
    return $p->[1][1];
}

# The first field that every element of an array of objects has, as a string or a whole
# number, with a different value in each.
sub distinguishing_field {
    my ($items) = @_;
    return undef unless @$items >= 2 && !grep { $_->[0] ne 'obj' } @$items;
    for my $p (@{ $items->[0][1] }) {
        my $f = $p->[0];
        my %seen;
        my $ok = 1;
        for my $it (@$items) {
            my ($q) = grep { $_->[0] eq $f } @{ $it->[1] };
            if (!$q || !($q->[1][0] eq 'str' || ($q->[1][0] eq 'raw' && $q->[1][1] =~ /^-?\d+$/))
                || $q->[1][1] =~ /[\[\]=]/ || $seen{ $q->[1][1] }++) {
                $ok = 0;
                last;
            }
        }
        return $f if $ok;
    }
    return undef;
}

# ---------------------------------------------------------------- commands

# A command line, with its comment on a line of its own and long commands broken.
sub command_lines {
    my ($line) = @_;
    my $body = $line =~ s/^\$ //r;
    my (@words, $comment);
    while ($body =~ /\G\s*((?:[^\s'"]+|'[^']*'|"(?:[^"\\]|\\.)*")+)/gc) {
        my ($w, $at) = ($1, $-[1]);
        if ($w =~ /^#/) {
            $comment = substr($body, $at);
            last;
        }
        push @words, $w;
    }
    if (!defined $comment && $body =~ /\G\s*(\S.*)$/) {
        push @words, $1;    # an unbalanced quote: keep the rest as it is
    }
    my @out;
    if (defined $comment) {
        $comment =~ s/\s+$//;
        push @out, wrap_words('# ', '# ', split / /, $comment =~ s/^#\s*//r);
    }
    # An option and its value stay on one line.
    my @groups;
    for my $w (@words) {
        if (@groups && $groups[-1] =~ /^-[^\s]*$/ && $groups[-1] ne '--' && $w !~ /^-/) {
            $groups[-1] .= " $w";
        } else {
            push @groups, $w;
        }
    }
    my @cmd;
    my $cur = '$' . (@groups ? ' ' . shift @groups : '');
    for my $g (@groups) {
        if (length("$cur $g") + 2 > $MAX) {
            push @cmd, "$cur \\";
            # Continuations are indented by four, or less where a long word needs the room.
            my $room = $MAX - 2 - length $g;
            $cur = ' ' x ($room < 0 ? 0 : $room > 4 ? 4 : $room) . $g;
        } else {
            $cur .= " $g";
        }
    }
    push @cmd, $cur;
    return (\@out, \@cmd);
}

sub wrap_words {
    my ($first, $next, @w) = @_;
    my @lines;
    my $cur = $first;
    for my $w (@w) {
        if (length($cur) + length($w) > $MAX && $cur ne $first && $cur ne $next) {
            $cur =~ s/ $//;
            push @lines, $cur;
            $cur = $next;
        }
        $cur .= "$w ";
    }
    $cur =~ s/ $//;
    push @lines, $cur;
    return @lines;
}

# ---------------------------------------------------------------- a block

sub kind {
    my ($line) = @_;
    return 'blank' if $line !~ /\S/;
    return 'command' if $line =~ /^\$ /;
    return 'json' if $line =~ /^\s*\{/ && length($line) > $MAX && parse_json($line =~ s/^\s+|\s+$//gr);
    return 'pipe' if $line =~ /^\s*\|/;
    return 'text';
}

# The HTML lines of one output (the text of a ```text block).
sub render {
    my ($text) = @_;
    my @lines = split /\n/, $text =~ s/\t/        /gr;
    s/\s+$// for @lines;
    my @html = ('<div class="output">');
    my @pre;    # text lines waiting for their <pre>
    my $flush = sub {
        return unless @pre;
        push @html, '<pre><code class="nohighlight">' . join("\n", map { esc($_) } @pre) . '</code></pre>';
        @pre = ();
    };
    my $i = 0;
    while ($i < @lines) {
        my $line = $lines[$i];
        my $k = kind($line);
        if ($k eq 'blank') { $flush->(); $i++; next }
        # The end of this paragraph.
        my $end = $i;
        $end++ while $end + 1 < @lines && $lines[$end + 1] =~ /\S/;
        if ($k eq 'command') {
            $flush->();
            my @parts;
            while ($i <= $end && kind($lines[$i]) eq 'command') {
                my ($comment, $cmd) = command_lines($lines[$i++]);
                push @parts, (map { '<span class="hljs-comment">' . esc($_) . '</span>' } @$comment),
                    map { esc($_) } @$cmd;
            }
            push @html, '<pre class="output-command"><code class="nohighlight">' . join("\n", @parts)
                . '</code></pre>';
            next;
        }
        if ($k eq 'json') {
            $flush->();
            my @flat;
            flatten(parse_json($line =~ s/^\s+|\s+$//gr), '', \@flat);
            push @html, table_html(header => undef, rows => \@flat, class => 'output-json');
            $i++;
            next;
        }
        my ($n, @table) = $k eq 'pipe' ? pipe_table(\@lines, $i, $end)
                                       : aligned_table(\@lines, $i, $end);
        if ($n) {
            $flush->();
            push @html, @table;
            $i += $n;
            next;
        }
        if (length($line) > $MAX) {
            # Prose: it wraps, each continuation indented under the line's start.
            $flush->();
            my ($indent) = $line =~ /^(\s*)/;
            my $style = length($indent) ? sprintf(' style="margin-inline-start: %dch"', length $indent) : '';
            push @html, qq{<p class="output-prose"$style>} . esc($line =~ s/^\s+//r) . '</p>';
            $i++;
            next;
        }
        push @pre, $line;
        $i++;
    }
    $flush->();
    push @html, '</div>';
    return @html;
}

# Rewrites the ```text blocks of a chapter's Markdown.
sub rewrite {
    my ($content) = @_;
    my (@out, $fence, $indent, @body);
    for my $line (split /\n/, $content, -1) {
        if (!defined $fence) {
            if ($line =~ /^(\s*)(```+|~~~+)\s*text\s*$/) {
                ($indent, $fence, @body) = ($1, $2);
                next;
            }
            push @out, $line;
        } elsif ($line =~ /^\s*\Q$fence\E\s*$/) {
            my $text = join "\n", map { s/^\Q$indent\E//r } @body;
            if ($text =~ /\S/) {
                push @out, map { "$indent$_" } render($text);
            } else {
                push @out, "$indent${fence}text", @body, $line;
            }
            undef $fence;
        } else {
            push @body, $line;
        }
    }
    push @out, "$indent${fence}text", @body if defined $fence;
    return join "\n", @out;
}

# ---------------------------------------------------------------- self-test

sub self_test {
    my $fails = 0;
    # A failed match in list context is an empty list: the message is always the last
    # argument, and no condition at all is a failure.
    my $ok = sub {
        my $what = pop;
        my $cond = @_ && $_[0];
        return if $cond;
        $fails++;
        print "FAIL: $what\n";
    };
    my $html = sub { join "\n", render($_[0]) };

    # A space-aligned table under a header; labels with single spaces; a header cell
    # with a space; a dash in a column of numbers.
    my $h = $html->(<<'EOF');
gpt2_fp32: 9435 operations, peak requested 16.23 GiB

  allocator                                                  reserved/requested   calls       calls by quarter     ns/op  x fixed
  ours, PyTorch's defaults (fixed segments)                              1.1374     200              198/2/0/0      1344     1.00
  ours, preset labs, mappings of up to 16 MiB (its default)              1.0269    1510       2453/460/240/256      8845     6.58
  PyTorch cudaMallocAsync                                                1.0689       0                      -      4490     3.34

(reserved/requested: peak reserved over peak requested; calls: driver mappings for expandable segments, segments for fixed ones)
EOF
    $ok->($h =~ m{<thead><tr><th>allocator</th><th class="num">reserved/requested</th><th class="num">calls</th><th class="num">calls by quarter</th><th class="num">ns/op</th><th class="num">x fixed</th></tr></thead>},
        "aligned header: $h");
    $ok->($h =~ m{<tr><td class="wrap">ours, preset labs, mappings of up to 16 MiB \(its default\)</td><td class="num">1.0269</td><td class="num">1510</td><td class="num">2453/460/240/256</td><td class="num">8845</td><td class="num">6.58</td></tr>},
        "aligned row with spaces in its label");
    $ok->($h =~ m{<td class="num">0</td><td class="num">-</td>}, "a dash in a column of numbers");
    $ok->($h =~ m{<pre><code class="nohighlight">gpt2_fp32: 9435 operations, peak requested 16.23 GiB</code></pre>}, "a short line stays text");
    $ok->($h =~ m{<p class="output-prose">\(reserved/requested: }, "a long note wraps as prose");
    $ok->($h !~ /\n\s*\n/, "no blank line in the HTML");

    # Two cells one space apart, told apart by the header; right-aligned numbers.
    $h = $html->(<<'EOF');
tensors   peak allocated, MB     in MiB  peak reserved
kept               419.43 MB 400.00 MiB     400.00 MiB
dropped              4.00 MB   3.81 MiB      20.00 MiB
EOF
    $ok->($h =~ m{<tr><td>kept</td><td class="num">419.43 MB</td><td class="num">400.00 MiB</td><td class="num">400.00 MiB</td></tr>},
        "a single space between header columns splits cells: $h");
    $h = $html->(<<'EOF');
key                                        before  after empty_cache
allocated_bytes.all.current             8,388,608          8,388,608
reserved_bytes.small_pool.current       2,097,152                  0
(122 keys in all)
EOF
    $ok->($h =~ m{<th class="num">after empty_cache</th>.*<td class="wrap">reserved_bytes.small_pool.current</td><td class="num">2,097,152</td><td class="num">0</td>}s,
        "right-aligned columns under a header: $h");
    $ok->($h =~ m{<pre><code class="nohighlight">\(122 keys in all\)</code></pre>}, "a line after the table stays text");

    # Names and values, and rows without a header: text.
    $h = $html->(<<'EOF');
trace            gpt2_varlen
conf             expandable_segments:False
ops              26523
peak reserved    24.44 GiB  (1.506x requested)
maps / unmaps    0 / 0
EOF
    $ok->($h !~ /<table/, "names and values stay text: $h");

    # Rows without a header: a table only when too wide.
    $h = $html->(<<'EOF');
x = torch.empty(1000, 1000)    address 0x7efd26800000  cudaMalloc calls: 1
del x; y = the same shape      address 0x7efd26800000  cudaMalloc calls: 1
EOF
    $ok->($h !~ /<table/ && $h =~ /<pre>/, "narrow rows without a header stay text: $h");
    $h = $html->(<<'EOF');
start                      allocated      0 B  reserved  0.0 MiB  taken from the driver  0.0 MiB
x = 1,000 bytes            allocated  1,024 B  reserved  2.0 MiB  taken from the driver  2.0 MiB
EOF
    $ok->($h =~ /<table/ && $h !~ /<thead>/ && $h =~ m{<td>start</td><td>allocated</td><td class="num">0 B</td>},
        "wide rows without a header: a table with no header row: $h");

    # A pipe table, and a new one right after it; a box of pipes with no separator.
    $h = $html->(<<'EOF');
| step                                    | time      |
| --------------------------------------- | --------- |
| first device call (creates the context) | 151.78 ms |
| second device call                      |    7.5 µs |
| size       | alloc    |
| ---------- | -------- |
|  20.00 MiB |  41.2 µs |
|===========================================================================|
|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |
|---------------------------------------------------------------------------|
EOF
    $ok->($h =~ m{<th>step</th><th class="num">time</th>.*<td>second device call</td><td class="num">7.5 µs</td></tr>\n</tbody></table></div>\n<div class="table-wrapper output-table"><table class="output">\n<thead><tr><th class="num">size</th>}s,
        "two pipe tables: $h");
    $ok->($h =~ m{<pre><code class="nohighlight">\|=+\|\n\|        Metric }, "a pipe box stays text");
    $h = $html->("|=========|\n|  PyTorch CUDA memory summary  |\n|---------|\n| a | b |\n");
    $ok->($h !~ /<table/, "a box's title over a rule is not a table header: $h");
    $h = $html->("| where                              | n |\n| ---------------------------------- | - |\n| pytorch-train.py:297 forward x1, 1 more | 1 |\n");
    $ok->($h =~ m{<td class="wrap"><span class="word">pytorch-train.py:297</span> forward x1, 1 more</td>},
        "a long text cell wraps at spaces only: $h");

    # A command: its comment above it, broken at spaces, an option with its value.
    my ($c, $cmd) = command_lines('$ cargo run --release -p lab-02 -- replay data/traces/gpt2_fp32.trace.csv.gz --device cuda --json --pytorch ci/pytorch-replay.py --conf preset:labs   # NVIDIA H100 80GB HBM3, driver 580.159.04');
    $ok->("@$c" eq '# NVIDIA H100 80GB HBM3, driver 580.159.04', "the comment: @$c");
    $ok->(!grep({ length > $MAX } @$cmd), "command lines fit: " . join(' / ', @$cmd));
    $ok->(join("\n", @$cmd) =~ /^\$ cargo run .* \\\n    .*--pytorch ci\/pytorch-replay.py/s, "continuations: " . join(' / ', @$cmd));
    my $joined = join ' ', map { s/ \\$//r =~ s/^\s+//r } @$cmd;
    $ok->($joined eq '$ cargo run --release -p lab-02 -- replay data/traces/gpt2_fp32.trace.csv.gz --device cuda --json --pytorch ci/pytorch-replay.py --conf preset:labs',
        "the command is unchanged: $joined");
    $ok->(!grep({ /--device \\$/ } @$cmd), "an option stays with its value");
    ($c, $cmd) = command_lines('$ python3 book/snippets/10-checkpointing-accumulation/tutorial_accumulation_batch_first.py   # NVIDIA H100');
    $ok->(join("\n", @$cmd) eq "\$ python3 \\\nbook/snippets/10-checkpointing-accumulation/tutorial_accumulation_batch_first.py",
        "a long word takes the room of the indentation: " . join(' / ', @$cmd));
    ($c, $cmd) = command_lines(q{$ echo 'a # b'   # cpu});
    $ok->("@$c" eq '# cpu' && "@$cmd" eq q{$ echo 'a # b'}, "a quoted # is not a comment: @$c / @$cmd");
    $h = $html->("\$ cargo run -p lab-01   # cpu\nok");
    $ok->($h =~ m{<pre class="output-command"><code class="nohighlight"><span class="hljs-comment"># cpu</span>\n\$ cargo run -p lab-01</code></pre>\n<pre><code class="nohighlight">ok</code></pre>}, "a short command: $h");

    # JSON: values by path, numbers as printed, arrays of objects by a field.
    my $json = '{"conf":"expandable_segments:False","driver_calls_per_quarter":[105,5,0,0],"driver_ns":{"map":{"calls":0,"ns":0}},"ns_per_op":1577.2682473268246,"s.t":{"a.b":3228},"bw":[{"bytes":1,"gbps":5.3},{"bytes":2,"gbps":55.43795}],"xs":[{"a":1.5},{"a":1.5}],"name":"<x>","e":""}';
    $h = $html->("\$ x --json\n$json");
    $ok->($h =~ m{<table class="output-json">}, "a long JSON line becomes a table: $h");
    for my $row (['conf', 'expandable_segments:False'], ['driver_calls_per_quarter', '[105,5,0,0]'],
                 ['driver_ns.map.calls', '0'], ['ns_per_op', '1577.2682473268246'],
                 ['"s.t"."a.b"', '3228'], ['bw[bytes=2].gbps', '55.43795'], ['xs[1].a', '1.5'],
                 ['name', '&lt;x&gt;'], ['e', '""']) {
        my ($k, $v) = map { esc($_) =~ s/&amp;(lt|gt);/&$1;/gr } @$row;
        $ok->($h =~ m{<tr><td(?: class="\w+")?>\Q$k\E</td><td(?: class="\w+")?>\Q$v\E</td></tr>}, "JSON row $k = $v");
    }
    $h = $html->('{"a":1,"b":[1,2]}');
    $ok->($h =~ m{<pre><code class="nohighlight">\{&quot;a&quot;:1,&quot;b&quot;:\[1,2\]\}</code></pre>}, "short JSON stays text: $h");
    $ok->(!defined parse_json('{"a":1,}'), "bad JSON does not parse");

    # Only ```text blocks change.
    my $md = "A\n\n```rust\nlet x = 1;  // a  b\n```\n\n```text\nhello\n```\n\n- item\n\n  ```text\n  | a | b |\n  | - | - |\n  | 1 | 2 |\n  ```\n";
    my $out = rewrite($md);
    $ok->($out =~ m{```rust\nlet x = 1;  // a  b\n```}, "rust blocks stay");
    $ok->($out =~ m{\n<div class="output">\n<pre><code class="nohighlight">hello</code></pre>\n</div>\n}, "a text block becomes HTML: $out");
    $ok->($out =~ m{\n  <div class="output">\n  <div class="table-wrapper output-table">}, "an indented block keeps its indentation: $out");
    $ok->(rewrite("```text\n```\n") eq "```text\n```\n", "an empty block stays");

    print $fails ? "outputs.pl: $fails self-test failures\n" : "outputs.pl: self-test passed\n";
    exit($fails ? 1 : 0);
}

# ---------------------------------------------------------------- main

if (@ARGV && $ARGV[0] eq 'supports') { exit 0 }
if (@ARGV && $ARGV[0] eq 'test') { self_test() }
if (@ARGV && $ARGV[0] eq 'show') {
    shift @ARGV;
    for my $file (@ARGV) {
        open my $fh, '<:encoding(UTF-8)', $file or die "$file: $!\n";
        local $/;
        print join("\n", render(scalar <$fh>)), "\n";
    }
    exit 0;
}

local $/;
my $json = JSON::PP->new->utf8->canonical;
my ($ctx, $book) = @{ $json->decode(scalar <STDIN>) };
sub walk {
    my ($items) = @_;
    for my $item (@$items) {
        next unless ref $item eq 'HASH' && exists $item->{Chapter};
        my $ch = $item->{Chapter};
        $ch->{content} = rewrite($ch->{content}) if defined $ch->{content};
        walk($ch->{sub_items} // []);
    }
}
walk($book->{items} // $book->{sections} // []);
print $json->encode($book);
