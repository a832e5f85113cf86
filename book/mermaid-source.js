// Diagram source reaches the page inside <script type="text/plain" class="mermaid-source">
// so that mdBook's search index leaves it out (see tools/diagrams-out-of-search.pl).
// Put each one back as the <pre class="mermaid"> element mermaid renders, before
// mermaid-init.js starts mermaid. The text is still HTML-escaped, exactly as
// mdbook-mermaid wrote it into the <pre>, so it goes back in as HTML.
(() => {
    for (const source of document.querySelectorAll('script.mermaid-source')) {
        const pre = document.createElement('pre');
        pre.className = 'mermaid';
        pre.innerHTML = source.textContent;
        source.replaceWith(pre);
    }
})();
