// The language switch: a link in the menu bar to the same page in the other edition.
// The English book is the site's root; the Chinese one (built from po/zh-CN.po) lives
// under zh-CN/ beside it. mdBook gives every page `path_to_root`, the way back to its
// edition's root, and the edition's language on <html lang>.
(function () {
  const chinese = document.documentElement.lang === "zh-CN";
  // Against the page's base: the 404 page has <base href> at its edition's root.
  const root = new URL(typeof path_to_root === "string" && path_to_root ? path_to_root : "./",
    document.baseURI);
  let page = location.pathname.startsWith(root.pathname)
    ? location.pathname.slice(root.pathname.length)
    : "";
  if (page === "") page = "index.html";
  const target = new URL((chinese ? "../" : "zh-CN/") + page, root);
  const link = document.createElement("a");
  link.href = target.pathname + location.hash;
  link.className = "language-switch";
  link.lang = chinese ? "en" : "zh-CN";
  link.hreflang = link.lang;
  link.textContent = chinese ? "English" : "中文";
  link.title = chinese ? "Read this page in English" : "阅读本页的中文版";
  const bar = document.querySelector(".right-buttons") || document.querySelector("#menu-bar");
  if (bar) bar.prepend(link);
})();
