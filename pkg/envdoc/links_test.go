package envdoc

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// Every link a document gives between the repository's files leads
// somewhere: the file exists, and a #fragment names a heading (or an
// <a id>) of the file it points into. The READMEs link each other's
// sections by their GitHub anchors, which change silently when a heading
// is reworded; a reader who follows one lands at the top of a long page.
// Links out of the repository (http, https, mailto) are not followed.
func TestEveryLinkTheDocumentsGiveLeadsSomewhere(t *testing.T) {
	docs := markdownFiles(t)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		anchors[path] = headingAnchors(string(text))
		return anchors[path]
	}
	checked := 0
	for _, doc := range docs {
		text, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range markdownLink.FindAllStringSubmatch(inlineCode.ReplaceAllString(withoutFences(string(text)), "``"), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			file, fragment, _ := strings.Cut(target, "#")
			dest := doc
			if file != "" {
				dest = filepath.Join(filepath.Dir(doc), file)
				if _, err := os.Stat(dest); err != nil {
					t.Errorf("%s links to %s, which does not exist", rel(doc), target)
					continue
				}
			}
			if fragment == "" || !strings.HasSuffix(dest, ".md") {
				continue
			}
			if !anchorsOf(dest)[fragment] {
				t.Errorf("%s links to %s: %s has no heading with the anchor #%s", rel(doc), target, rel(dest), fragment)
			}
		}
	}
	if checked < 20 {
		t.Errorf("checked %d links in %d documents, want the dozens the repository holds", checked, len(docs))
	}
}

// The anchors GitHub gives a document's headings: lower case, every
// character but letters, digits, spaces, '-' and '_' dropped, spaces made
// '-', and a repeated anchor suffixed -1, -2, …; plus explicit <a id> and
// <a name> anchors.
func TestHeadingAnchorsAreGitHubs(t *testing.T) {
	text := "# Export service\n## Finding a request by its `meta.request_id`\n" +
		"### Behind an ingress (nginx, HAProxy)\n## Statuses beyond the contract's table\n" +
		"```\n# not a heading\n```\n## Notes\n## Notes\n<a id=\"here\"></a>\n"
	got := headingAnchors(text)
	for _, want := range []string{"export-service", "finding-a-request-by-its-metarequest_id",
		"behind-an-ingress-nginx-haproxy", "statuses-beyond-the-contracts-table", "notes", "notes-1", "here"} {
		if !got[want] {
			t.Errorf("no anchor %q among %v", want, got)
		}
	}
	if got["not-a-heading"] {
		t.Errorf("a line in a code block was read as a heading: %v", got)
	}
}

func headingAnchors(text string) map[string]bool {
	anchors := map[string]bool{}
	for _, line := range strings.Split(withoutFences(text), "\n") {
		if m := explicitAnchor.FindAllStringSubmatch(line, -1); m != nil {
			for _, a := range m {
				anchors[a[1]] = true
			}
		}
		level := len(line) - len(strings.TrimLeft(line, "#"))
		if level == 0 || level > 6 || !strings.HasPrefix(line[level:], " ") {
			continue
		}
		slug := slugOf(strings.TrimSpace(line[level:]))
		unique := slug
		for n := 1; anchors[unique]; n++ {
			unique = slug + "-" + strconv.Itoa(n)
		}
		anchors[unique] = true
	}
	return anchors
}

func slugOf(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// withoutFences blanks fenced code blocks, where neither a link nor a
// heading is one (inline code is blanked for links only: a heading's
// anchor keeps its text). Lines are kept, so headings stay at a line's
// start.
func withoutFences(text string) string {
	var b strings.Builder
	fenced := false
	for _, line := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			b.WriteString("\n")
			continue
		}
		if fenced {
			b.WriteString("\n")
			continue
		}
		b.WriteString(line)
	}
	return b.String()
}

func markdownFiles(t *testing.T) []string {
	t.Helper()
	var docs []string
	err := walkRepository(func(folder string) bool { return folder == "testdata" }, func(path string) error {
		if strings.HasSuffix(path, ".md") {
			docs = append(docs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

func rel(path string) string { return strings.TrimPrefix(path, root+"/") }

var (
	markdownLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	explicitAnchor = regexp.MustCompile(`<a (?:id|name)="([^"]+)"`)
	inlineCode     = regexp.MustCompile("`[^`\n]*`")
)
