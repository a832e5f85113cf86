// This Source Code Form is subject to the terms of the Mozilla Public
// License, v. 2.0. If a copy of the MPL was not distributed with this
// file, You can obtain one at https://mozilla.org/MPL/2.0/.

(() => {
    const darkThemes = ['ayu', 'navy', 'coal'];
    const lightThemes = ['light', 'rust'];

    const classList = document.getElementsByTagName('html')[0].classList;

    let lastThemeWasLight = true;
    for (const cssClass of classList) {
        if (darkThemes.includes(cssClass)) {
            lastThemeWasLight = false;
            break;
        }
    }

    const theme = lastThemeWasLight ? 'default' : 'dark';
    // Diagrams are drawn at their own size, not shrunk to the column: a wide diagram
    // scrolls sideways in its box (book/outputs.css) rather than shrinking its text
    // below 12 px. Gantt charts' labels and axis get the same size.
    mermaid.initialize({
        startOnLoad: true,
        theme,
        flowchart: {
            useMaxWidth: false,
            nodeSpacing: 24,
            rankSpacing: 40,
            wrappingWidth: 170,
            subGraphTitleMargin: { top: 0, bottom: 6 },
        },
        sequence: { useMaxWidth: false },
        gantt: { useMaxWidth: false, fontSize: 13, sectionFontSize: 13 },
        themeCSS: 'g.tick text { font-size: 13px; }',
    });

    // Simplest way to make mermaid re-render the diagrams in the new theme is via refreshing the page

    for (const darkTheme of darkThemes) {
        document.getElementById('mdbook-theme-' + darkTheme).addEventListener('click', () => {
            if (lastThemeWasLight) {
                window.location.reload();
            }
        });
    }

    for (const lightTheme of lightThemes) {
        document.getElementById('mdbook-theme-' + lightTheme).addEventListener('click', () => {
            if (!lastThemeWasLight) {
                window.location.reload();
            }
        });
    }
})();
