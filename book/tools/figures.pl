#!/usr/bin/env perl
# An mdBook preprocessor that puts into the prose the figures the labs' output files
# recorded, so that a number in a sentence cannot drift from the output it describes.
#
#   {{#figure PATH: KEY}}
#   {{#figure PATH: KEY ; FORMAT}}
#
# PATH is relative to the chapter, like an include (../outputs/lab-01/lazy-init-gpu.txt).
# The directive is replaced by the value; the build fails, naming the chapter, the file
# and the key, when the file is missing or the key does not select exactly one value.
# `\{{#figure ...}}` is left as text (without the backslash), as mdBook does for includes.
#
# KEY, for a text output:
#
#   ROW                 the row whose first cell is ROW (exactly, or else the only row
#                       whose first cell starts with ROW); the row must then have exactly
#                       one cell after its label, which is the value
#   ROW | COLUMN        the cell of that row in COLUMN: a header name (exactly, or a
#                       unique prefix) or a number (1 is the row's label)
#   SCOPE >> ...        look only from the first line containing SCOPE up to the next
#                       command line (a line starting with "$ "), e.g. one run of several
#                       in a file: `expandable_segments:True >> peak reserved | 2`
#   /REGEX/             the first capture group of REGEX (Perl syntax), which must match
#                       exactly one line (in the scope): for a sentence such as
#                       "copy 1.213 ms, compute 1.143 ms"
#
#   A row is a line of a `| a | b |` table (cells between pipes) or, otherwise, a line
#   whose cells are separated by two spaces or more (`peak reserved   236.00 MiB`).
#   A pipe row's header is the nearest row above it that a Markdown separator
#   (`| --- | --- |`) follows, or that starts its block and a rule (`|-----|`) follows; a space-aligned row's header is the first line of its paragraph.
#   Rules and blank lines are never rows.
#
# KEY, for a JSON line (a line starting with `{`; the first one in the scope, and it must
# be the only one there):
#
#   a.b.c               a dotted path: object keys, or array indices from 0; a key
#                       that holds dots is quoted: stats."allocation.all.allocated"
#   a[k=v].c            in an array, the one element whose field k equals v
#                       (e.g. bandwidth[bytes=1073741824].pinned_htod_gbps)
#
# FORMAT (optional) rewrites the value's leading number: `%.1f` (any printf number
# format; the flag ' groups thousands: `%'d` gives 3,228), optionally after a scaling
# `/1000` or `*100`, and optionally followed by text that replaces the rest of the value
# (its unit), e.g. `; /1000 %.0f µs` turns 76950.0 into "77 µs". Without a text, an
# unscaled value keeps its first word after the number (its unit: `7.5 µs ; %.0f` gives
# "8 µs") and a scaled one keeps none; without a format the value is printed as recorded.
#
# `perl figures.pl test` runs the script's self-test; `perl figures.pl check DIR` resolves
# every directive of the Markdown files under DIR (README.md files aside) without
# building the book; `perl
# figures.pl show FILE.md` prints one file with its figures in place.
use strict;
use warnings;
use utf8;
use JSON::PP;
use File::Basename qw(dirname);
use File::Spec;

binmode STDERR, ':encoding(UTF-8)';

# Returns (value, undef) or (undef, problem).
sub resolve {
    my ($file, $spec) = @_;
    my ($key, $format) = split /\s*;\s*/, $spec, 2;
    $key =~ s/^\s+|\s+$//g;
    # In a Markdown table a pipe inside the directive is escaped (\|), as in any cell;
    # it means the same key (a regular expression's \| keeps its own meaning).
    $key =~ s/\\\|/|/g unless $key =~ m{(?:^|>>\s*)/};
    return (undef, "no such file") unless -f $file;
    open my $fh, '<:encoding(UTF-8)', $file or return (undef, "cannot read it: $!");
    local $/ = "\n";
    my @lines = map { s/\r?\n\z//r } <$fh>;
    close $fh;

    # The scope.
    my ($from, $to) = (0, $#lines);
    if ($key =~ /^(.*?)\s*>>\s*(.*)$/) {
        my ($scope, $rest) = ($1, $2);
        my ($start) = grep { index($lines[$_], $scope) >= 0 } 0 .. $#lines;
        return (undef, "no line contains the scope '$scope'") unless defined $start;
        $from = $start;
        for my $i ($start + 1 .. $#lines) {
            if ($lines[$i] =~ /^\$ /) { $to = $i - 1; last }
        }
        $key = $rest;
    }
    my @idx = ($from .. $to);

    my ($value, $problem);
    if ($key =~ m{^/(.*)/$}) {
        my $re = eval { qr/$1/ } or return (undef, "bad regular expression: $@");
        my @hits = grep { $lines[$_] =~ $re } @idx;
        return (undef, "no line matches $key") unless @hits;
        return (undef, scalar(@hits) . " lines match $key") if @hits > 1;
        $lines[$hits[0]] =~ $re;
        return (undef, "$key has no capture group") unless defined $1;
        $value = $1;
    } elsif (my @json = grep { $lines[$_] =~ /^\s*\{/ } @idx) {
        return (undef, scalar(@json) . " JSON lines in the scope: narrow it with SCOPE >>")
            if @json > 1;
        ($value, $problem) = json_path($lines[$json[0]], $key);
    } else {
        ($value, $problem) = table_cell(\@lines, \@idx, $key);
    }
    return (undef, $problem) if defined $problem;
    return format_value($value, $format);
}

sub json_path {
    my ($line, $path) = @_;
    my $data = eval { JSON::PP->new->decode($line) };
    return (undef, "its JSON line does not parse: $@") unless defined $data;
    my @steps;
    my $rest = $path;
    while (length $rest) {
        if ($rest =~ s/^"([^"]*)"//) { push @steps, [key => $1] }
        elsif ($rest =~ s/^([^.\["]+)//) { push @steps, [key => $1] }
        elsif (!@steps || $rest !~ /^\[/) { return (undef, "cannot read the path '$path'") }
        while ($rest =~ s/^\[([^=\]]+)=([^\]]*)\]//) { push @steps, [select => $1, $2] }
        last unless length $rest;
        $rest =~ s/^\.// && length $rest or return (undef, "cannot read the path '$path'");
    }
    return (undef, "empty path") unless @steps;
    my ($node, $at) = ($data, '');
    for my $step (@steps) {
        my ($kind, @arg) = @$step;
        if ($kind eq 'key') {
            if (ref $node eq 'HASH' && exists $node->{$arg[0]}) {
                $node = $node->{$arg[0]};
            } elsif (ref $node eq 'ARRAY' && $arg[0] =~ /^\d+$/ && $arg[0] < @$node) {
                $node = $node->[$arg[0]];
            } else {
                return (undef, "no '$arg[0]' at '" . ($at || '(top)') . "'");
            }
            $at .= ($at eq '' ? '' : '.') . $arg[0];
        } else {
            return (undef, "'$at' is not an array") unless ref $node eq 'ARRAY';
            my @m = grep { ref $_ eq 'HASH' && defined $_->{$arg[0]} && $_->{$arg[0]} eq $arg[1] } @$node;
            return (undef, scalar(@m) . " elements of '$at' have $arg[0]=$arg[1]") unless @m == 1;
            $node = $m[0];
            $at .= "[$arg[0]=$arg[1]]";
        }
    }
    return (undef, "'$path' is not a single value") if ref $node;
    return (undef, "'$path' is null") unless defined $node;
    return ("$node", undef);
}

sub cells {
    my ($line) = @_;
    return () if $line !~ /\S/;
    if ($line =~ /^\s*\|/) {
        return () if $line =~ /^[\s|:=+-]*$/;    # a rule
        my $t = $line =~ s/^\s*\|//r;
        $t =~ s/\|\s*$//;
        return map { s/^\s+|\s+$//gr } split /\|/, $t, -1;
    }
    my $t = $line =~ s/^\s+|\s+$//gr;
    return split /\s{2,}/, $t;
}

sub is_rule { $_[0] =~ /^\s*\|[\s|:=+-]*$/ && $_[0] =~ /[-=]/ }

sub header_of {
    my ($lines, $i, $from) = @_;
    if ($lines->[$i] =~ /^\s*\|/) {
        for (my $j = $i - 1; $j >= $from; $j--) {
            next unless $lines->[$j] =~ /^\s*\|/ && !is_rule($lines->[$j]);
            next unless $j + 1 <= $#$lines && is_rule($lines->[$j + 1]);
            # A Markdown separator (`| --- | --- |`) follows only a header; a plain rule
            # (`|-----|`) also closes groups of rows, so there the header is a row that
            # starts its block.
            my $markdown = $lines->[$j + 1] =~ /\|.*\|.*\|/;
            my $first = $j == 0 || $lines->[$j - 1] !~ /^\s*\|/ || is_rule($lines->[$j - 1]);
            return [cells($lines->[$j])] if $markdown || $first;
        }
        return;
    }
    my $j = $i;
    $j-- while $j > $from && $lines->[$j - 1] =~ /\S/ && $lines->[$j - 1] !~ /^\s*\|/
        && cells($lines->[$j - 1]) >= 2;
    return [cells($lines->[$j])];
}

sub table_cell {
    my ($lines, $idx, $key) = @_;
    my ($row, $col) = map { s/^\s+|\s+$//gr } split /\s+\|\s+|\s+\|$/, $key, 2;
    return (undef, "empty row label") unless defined $row && length $row;
    my (@exact, @prefix);
    for my $i (@$idx) {
        next if is_rule($lines->[$i]);
        my @c = cells($lines->[$i]);
        next unless @c >= 2;
        if ($c[0] eq $row) { push @exact, $i }
        elsif (index($c[0], $row) == 0) { push @prefix, $i }
    }
    my @hits = @exact ? @exact : @prefix;
    return (undef, "no row '$row'") unless @hits;
    return (undef, scalar(@hits) . " rows '$row' (narrow it with SCOPE >>)") if @hits > 1;
    my $i = $hits[0];
    my @c = cells($lines->[$i]);
    my $n;
    if (!defined $col || $col eq '') {
        return (undef, "row '$row' has " . (@c - 1) . " values: name a column (ROW | COLUMN)")
            unless @c == 2;
        $n = 2;
    } elsif ($col =~ /^\d+$/) {
        $n = $col;
    } else {
        my $h = header_of($lines, $i, $idx->[0]);
        return (undef, "row '$row' has no header to find column '$col' in") unless $h;
        my @e = grep { $h->[$_] eq $col } 0 .. $#$h;
        @e = grep { index($h->[$_], $col) == 0 } 0 .. $#$h unless @e;
        return (undef, "no single column '$col' in the header of row '$row'") unless @e == 1;
        $n = $e[0] + 1;
    }
    return (undef, "row '$row' has no column $n") unless $n >= 1 && $n <= @c && length $c[$n - 1];
    return ($c[$n - 1], undef);
}

sub format_value {
    my ($value, $format) = @_;
    return ($value, undef) unless defined $format && $format =~ /\S/;
    my ($op, $k, $fmt, $unit) =
        $format =~ m{^\s*(?:([*/])\s*([0-9.]+)\s+)?(%[-+ 0#']*\d*(?:\.\d+)?[fdeg])(.*?)\s*$}
        or return (undef, "bad format '$format' (expected e.g. '%.1f' or '/1000 %.0f µs')");
    my ($num, $rest) = $value =~ /^\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][-+]?\d+)?)(.*)$/
        or return (undef, "value '$value' does not start with a number");
    $num =~ s/,//g;
    $num = $op eq '/' ? $num / $k : $num * $k if defined $op;
    my $group = $fmt =~ s/'//g;
    my $out = sprintf $fmt, $num;
    1 while $group && $out =~ s/^([-+ ]?\d+)(\d{3})/$1,$2/;
    return ($out . (length $unit ? $unit : ''), undef) if length $unit;
    return ($out, undef) if defined $op;    # a scaled number has lost its unit
    return ($out . ($rest =~ /^\s/ ? $rest =~ s/^(\s+\S+).*$/$1/r : ''), undef);
}

# Replaces the directives of one chapter's text; pushes problems.
sub expand {
    my ($text, $dir, $where, $problems) = @_;
    $text =~ s~(\\?)\{\{#figure\s+([^:}]+?):\s*([^}]*?)\s*\}\}~
        my ($esc, $path, $spec) = ($1, $2, $3);
        if ($esc) { "{{#figure $path: $spec}}" }
        else {
            my $file = File::Spec->catfile($dir, $path);
            my ($v, $p) = resolve($file, $spec);
            if (defined $p) { push @$problems, "$where: {{#figure $path: $spec}}: $p"; '??' }
            else { $v }
        }
    ~ge;
    push @$problems, "$where: a {{#figure}} directive without 'PATH: KEY'"
        while $text =~ /(?<!\\)\{\{#figure(?![^}]*:)[^}]*\}\}/g;
    return $text;
}

sub self_test {
    my $dir = File::Spec->catdir(File::Spec->tmpdir, "figures-test-$$");
    mkdir $dir or die "mkdir $dir: $!";
    my %files = (
        'a.txt' => <<'EOF',
$ cargo run --release -p lab-01   # NVIDIA H200
| step                                    | time      |
| --------------------------------------- | --------- |
| first device call (creates the context) | 151.78 ms |
| second device call                      |    7.5 µs |
| size       | alloc    | free     |
| ---------- | -------- | -------- |
|  20.00 MiB |  41.2 µs |  48.3 µs |
Training-like loop: copy 1.213 ms, compute 1.143 ms

$ replay --conf expandable_segments:False
peak reserved    236.00 MiB  (1.044x requested)
$ replay --conf expandable_segments:True
peak reserved    230.00 MiB  (1.017x requested)
EOF
        'b.txt' => '$ bench --json' . "\n"
            . '{"s.t":{"a.b":3228},"raw":{"512":76950.0},"bw":[{"bytes":1,"gbps":5.3},{"bytes":2,"gbps":55.43795}]}' . "\n",
    );
    for (keys %files) {
        open my $fh, '>:encoding(UTF-8)', "$dir/$_" or die;
        print $fh $files{$_};
        close $fh;
    }
    my @good = (
        ['a.txt: first device call (creates the context)', '151.78 ms'],
        ['a.txt: first device call', '151.78 ms'],
        ['a.txt: second device call ; %.0f', '8 µs'],
        ['a.txt: 20.00 MiB | free', '48.3 µs'],
        ['a.txt: 20.00 MiB | 2', '41.2 µs'],
        ['a.txt: 20.00 MiB \\| free', '48.3 µs'],
        ['a.txt: expandable_segments:True >> peak reserved \\| 2', '230.00 MiB'],
        ['a.txt: /^\\|  20.00 MiB \\| +([\\d.]+ µs)/', '41.2 µs'],
        ['a.txt: /copy ([\d.]+ ms)/', '1.213 ms'],
        ['a.txt: expandable_segments:True >> peak reserved | 2', '230.00 MiB'],
        ['a.txt: expandable_segments:False >> peak reserved | 3', '(1.044x requested)'],
        ['b.txt: raw.512 ; /1000 %.0f µs', '77 µs'],
        ['a.txt: second device call ; *1000 %.0f', '7500'],
        ['b.txt: bw[bytes=2].gbps ; %.1f', '55.4'],
        ['b.txt: bw.0.gbps', '5.3'],
        ['b.txt: "s.t"."a.b"', '3228'],
        ['b.txt: "s.t"."a.b" ; %\'d', '3,228'],
        ['\\{{#figure a.txt: no such row}}', '{{#figure a.txt: no such row}}'],
    );
    my @bad = (
        ['missing.txt: first device call', 'no such file'],
        ['a.txt: third device call', "no row 'third device call'"],
        ['a.txt: 20.00 MiB', 'name a column'],
        ['a.txt: 20.00 MiB | total', "no single column 'total'"],
        ['a.txt: peak reserved | 2', "2 rows 'peak reserved'"],
        ['b.txt: raw.1024', "no '1024' at 'raw'"],
        ['b.txt: bw[bytes=3].gbps', '0 elements'],
    );
    my $failed = 0;
    for (@good) {
        my ($d, $want) = @$_;
        my @p;
        my $src = $d =~ /^\\/ ? $d : "{{#figure $d}}";
        my $got = expand("x $src y", $dir, 'test.md', \@p);
        if (@p || $got ne "x $want y") { $failed++; print STDERR "FAIL: $d gave '$got' @p\n" }
    }
    for (@bad) {
        my ($d, $want) = @$_;
        my @p;
        expand("{{#figure $d}}", $dir, 'test.md', \@p);
        unless (@p == 1 && index($p[0], $want) >= 0 && index($p[0], 'test.md') == 0) {
            $failed++;
            print STDERR "FAIL: $d should fail with '$want', gave: @p\n";
        }
    }
    # The preprocessor itself must exit non-zero on a bad key and print the value on a good one.
    my $book = sub {
        my ($content) = @_;
        my $ctx = { root => $dir, config => { book => { src => '.' } } };
        my $b = { items => [{ Chapter => { name => 't', source_path => 'ch.md', content => $content, sub_items => [] } }] };
        open my $fh, '>', "$dir/in.json" or die;
        print $fh JSON::PP->new->utf8->encode([$ctx, $b]);
        close $fh;
        my $out = `perl "$0" < "$dir/in.json" 2>"$dir/err.txt"`;
        return ($? >> 8, $out);
    };
    my ($rc, $out) = $book->('x {{#figure a.txt: second device call}}');
    unless ($rc == 0 && $out =~ /"x 7\.5 /) { $failed++; print STDERR "FAIL: a build with a present key: rc $rc\n" }
    ($rc) = $book->('{{#figure a.txt: no such key}}');
    unless ($rc != 0) { $failed++; print STDERR "FAIL: a build with a missing key exited 0\n" }
    # Numbers typed into prose: measurements are reported, settings and bound figures not.
    my @typed = unbound_in(
        "A 1 GiB tensor takes 0.28 s; 14,130 MiB used, 57 % busy, 3.4 × faster.\n"
            . "Rounded to 512 bytes, 20 MiB segments, 10 ms polls, 2,048 MiB, 20 %.\n"
            . "Bound: {{#figure a.txt: first device call}}; code `used 14,130 MiB`.\n"
            . "```text\n185 ms\n```\nThe 1990s; 4x speed-up; 513 bytes.\n",
        { '513 bytes' => 1 });
    my $typed = join '; ', @typed;
    unless ($typed eq '0.28 s; 14,130 MiB; 57 %; 3.4 ×') {
        $failed++;
        print STDERR "FAIL: unbound numbers: got '$typed'\n";
    }
    unlink glob "$dir/*";
    rmdir $dir;
    my $n = @good + @bad + 3;
    die "figures.pl self-test: $failed of $n checks failed\n" if $failed;
    print "figures.pl self-test: $n checks passed\n";
    exit 0;
}

sub check_tree {
    my ($root) = @_;
    my @problems;
    my $count = 0;
    no warnings "once";
    require File::Find;
    File::Find::find({ no_chdir => 1, wanted => sub {
        return unless /\.md$/ && !/README\.md$/ && -f $_;
        open my $fh, '<:encoding(UTF-8)', $_ or die;
        local $/;
        my $text = <$fh>;
        $count++ while $text =~ /(?<!\\)\{\{#figure/g;
        expand($text, $File::Find::dir, $File::Find::name, \@problems);
    } }, $root);
    print STDERR "figures: $_\n" for @problems;
    exit 1 if @problems;
    print "figures: $count directives resolved\n";
    exit 0;
}

# The prose of a Markdown file: no fenced blocks, no inline code, no link targets, and
# each directive ({{#figure}}, {{#include}}) one word, "X".
sub prose_of {
    my ($text) = @_;
    $text =~ s/^(```|~~~).*?^\1[^\n]*$//msg;
    $text =~ s/<!--.*?-->//sg;
    $text =~ s/(?<!\\)\{\{#.*?\}\}/X/sg;
    $text =~ s/`[^`\n]*`/C/g;
    $text =~ s/\]\([^)\s]*\)/]/g;
    return $text;
}

# Numbers with a unit of measure that a sentence types instead of binding: a size, a
# time, a rate, a share or a ratio. The constants of the system are listed in
# constants.txt beside this script (one "number unit" a line) and pass.
my $UNIT = qr{(?:[KMGT]i?B(?:/s)?|bytes?|B|ns|µs|us|ms|s|seconds?|minutes?|%|×|x|percent|W|TFLOP/?S|TFLOPS|GHz|MHz)};

sub constants {
    my %ok;
    my $file = File::Spec->catfile(dirname(__FILE__), 'constants.txt');
    open my $fh, '<:encoding(UTF-8)', $file or return \%ok;
    while (<$fh>) {
        s/#.*//;
        s/^\s+|\s+$//g;
        $ok{$_} = 1 if length;
    }
    return \%ok;
}

# Whether a number reads as a measurement rather than a setting: a setting is round (a
# power of two, or one or two significant digits: 20 MiB, 1,600 MiB, 50 ms, 8192 ×); a
# measurement has a fraction (0.28 s, 9.9 %) or more digits (14,130 MiB, 185 ms); a
# share is a setting only in steps of five (20 %, not 57 %).
sub looks_measured {
    my ($num, $unit) = @_;
    (my $n = $num) =~ s/,//g;
    return 1 if $n =~ /\.\d*[1-9]/;
    $n =~ s/\..*//;
    return 1 if $unit =~ /^(?:%|percent)$/ && $n % 5;
    return 0 if $n > 0 && ($n & ($n - 1)) == 0;
    (my $digits = $n) =~ s/0+$//;
    return length($digits) > 2 ? 1 : 0 unless $unit =~ /^(?:ns|µs|us|ms|s|seconds?|minutes?)$/;
    return $digits =~ /^[125]?$/ ? 0 : 1;
}

sub unbound_in {
    my ($text, $ok) = @_;
    my @hits;
    my $n = 0;
    for my $line (split /\n/, prose_of($text)) {
        $n++;
        while ($line =~ /(?<![\w.,\/-])(\d[\d,]*(?:\.\d+)?)(\s?)($UNIT)(?![\w\/])/g) {
            my ($num, $sp, $unit) = ($1, $2, $3);
            next if $unit eq 'x' && $sp ne '';
            next if $unit eq 's' && $sp eq '';    # "1990s", "4s"
            my $norm = "$num $unit";
            next if $ok->{$norm} || $ok->{"$num$unit"};
            next unless looks_measured($num, $unit);
            push @hits, $norm;
        }
    }
    return @hits;
}

sub markdown_files {
    my @files;
    no warnings "once";
    require File::Find;
    for my $arg (@_) {
        if (-d $arg) {
            File::Find::find({ no_chdir => 1, wanted => sub {
                push @files, $_ if /\.md$/ && !/README\.md$/ && !/SUMMARY\.md$/ && -f $_;
            } }, $arg);
        } else {
            push @files, $arg;
        }
    }
    return sort @files;
}

sub read_text {
    open my $fh, '<:encoding(UTF-8)', $_[0] or die "$_[0]: $!\n";
    local $/;
    return scalar <$fh>;
}

# `figures.pl unbound FILE|DIR...`: lists each file's measured-looking numbers that no
# directive binds, and fails when there is one.
sub unbound {
    my $ok = constants();
    my $total = 0;
    binmode STDOUT, ':encoding(UTF-8)';
    for my $file (markdown_files(@_)) {
        my @hits = unbound_in(read_text($file), $ok);
        next unless @hits;
        $total += @hits;
        print "$file: ", scalar(@hits), " unbound: ", join('; ', @hits), "\n";
    }
    print "figures: $total unbound numbers\n";
    exit($total ? 1 : 0);
}

# `figures.pl words LIMIT FILE|DIR...`: the words of each file's prose; fails when one
# passes LIMIT (a chapter is read in one sitting).
sub words {
    my ($limit, @args) = @_;
    my $over = 0;
    for my $file (markdown_files(@args)) {
        my $n = () = prose_of(read_text($file)) =~ /\S+/g;
        my $mark = $n > $limit ? "  over $limit" : '';
        $over++ if $mark;
        printf "%6d %s%s\n", $n, $file, $mark;
    }
    exit($over ? 1 : 0);
}

# `mdbook` first asks whether we support a renderer: we support all of them.
exit 0 if @ARGV && $ARGV[0] eq 'supports';
unbound(@ARGV[1 .. $#ARGV]) if @ARGV && $ARGV[0] eq 'unbound';
words(@ARGV[1 .. $#ARGV]) if @ARGV && $ARGV[0] eq 'words';
self_test() if @ARGV && $ARGV[0] eq 'test';
check_tree($ARGV[1] // '.') if @ARGV && $ARGV[0] eq 'check';
if (@ARGV && $ARGV[0] eq 'show') {    # prints one Markdown file with its figures in place
    open my $fh, '<:encoding(UTF-8)', $ARGV[1] or die "$ARGV[1]: $!\n";
    local $/;
    my @problems;
    binmode STDOUT, ':encoding(UTF-8)';
    print expand(scalar <$fh>, dirname($ARGV[1]), $ARGV[1], \@problems);
    print STDERR "figures: $_\n" for @problems;
    exit(@problems ? 1 : 0);
}

local $/;
my $input = <STDIN>;
my $json = JSON::PP->new->utf8->canonical;
my ($ctx, $book) = @{ $json->decode($input) };
my $src = File::Spec->catdir($ctx->{root}, $ctx->{config}{book}{src} // 'src');

my @problems;
sub walk {
    my ($items) = @_;
    for my $item (@$items) {
        next unless ref $item eq 'HASH' && exists $item->{Chapter};
        my $ch = $item->{Chapter};
        my $path = $ch->{source_path} // $ch->{path};
        my $where = $path // $ch->{name};
        my $dir = defined $path ? File::Spec->catdir($src, dirname($path)) : $src;
        $ch->{content} = expand($ch->{content} // '', $dir, $where, \@problems);
        walk($ch->{sub_items} // []);
    }
}
walk($book->{items} // $book->{sections} // []);

if (@problems) {
    print STDERR "figures: $_\n" for @problems;
    exit 1;
}
print $json->encode($book);
