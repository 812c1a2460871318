package catalog

import (
	"encoding/json"
	"strconv"
)

// tri is a word in ENG, RUS and UKR.
type tri [3]string

var seedCountries = []tri{
	{"Austria", "Австрия", "Австрія"}, {"Germany", "Германия", "Німеччина"}, {"France", "Франция", "Франція"},
	{"Poland", "Польша", "Польща"}, {"Ukraine", "Украина", "Україна"}, {"Russian Empire", "Российская империя", "Російська імперія"},
	{"United Kingdom", "Великобритания", "Велика Британія"}, {"United States", "США", "США"}, {"Italy", "Италия", "Італія"},
	{"Spain", "Испания", "Іспанія"}, {"Netherlands", "Нидерланды", "Нідерланди"}, {"Switzerland", "Швейцария", "Швейцарія"},
	{"Sweden", "Швеция", "Швеція"}, {"Ottoman Empire", "Османская империя", "Османська імперія"}, {"Japan", "Япония", "Японія"},
	{"China", "Китай", "Китай"}, {"Mexico", "Мексика", "Мексика"}, {"Canada", "Канада", "Канада"},
}

var seedDenominations = []tri{
	{"1 Thaler", "1 талер", "1 талер"}, {"5 Mark", "5 марок", "5 марок"}, {"20 Francs", "20 франков", "20 франків"},
	{"1 Rouble", "1 рубль", "1 рубль"}, {"10 Hryvnia", "10 гривен", "10 гривень"}, {"1 Crown", "1 крона", "1 крона"},
	{"1 Dollar", "1 доллар", "1 долар"}, {"2 Zloty", "2 злотых", "2 злотих"}, {"1 Ducat", "1 дукат", "1 дукат"},
	{"1/2 Penny", "1/2 пенни", "1/2 пенні"}, {"5 Kopecks", "5 копеек", "5 копійок"}, {"1 Sovereign", "1 соверен", "1 соверен"},
	{"8 Reales", "8 реалов", "8 реалів"}, {"10 Yen", "10 иен", "10 єн"}, {"50 Lire", "50 лир", "50 лір"},
}

var seedMetals = []tri{
	{"silver", "серебро", "срібло"}, {"gold", "золото", "золото"}, {"copper", "медь", "мідь"},
	{"bronze", "бронза", "бронза"}, {"nickel", "никель", "нікель"}, {"billon", "биллон", "білон"},
}

var seedGrades = []string{"G", "VG", "F", "VF", "XF", "AU", "UNC", "PF", "MS-63", "MS-65"}

var seedMints = []string{"Vienna", "Berlin", "Paris", "Warsaw", "Kyiv", "St. Petersburg", "London",
	"Philadelphia", "Rome", "Madrid", "Utrecht", "Bern", "Stockholm", "Osaka", "Mexico City"}

var seedCategories = []struct{ id, name string }{
	{"world-silver", "World silver coins"}, {"world-gold", "World gold coins"}, {"europe-modern", "Modern Europe"},
	{"commemoratives", "Commemorative coins"}, {"tokens", "Tokens and medals"}, {"ancient", "Ancient coins"},
	{"bullion", "Bullion"}, {"patterns", "Patterns and trial strikes"},
}

var seedCurrencies = []string{"EUR", "EUR", "USD", "USD", "UAH", "GBP", "PLN", "CHF"}

var seedDescriptions = tri{
	"A %s %s coin struck at the %s mint, graded %s. Original surfaces with light toning; see the photos for details.",
	"Монета %s, %s, отчеканена на монетном дворе %s, состояние %s. Оригинальная поверхность, лёгкая патина; подробности на фото.",
	"Монета %s, %s, карбована на монетному дворі %s, стан %s. Оригінальна поверхня, легка патина; подробиці на фото.",
}

// item draws item n, and returns it with its texts and images as JSON for
// the source columns.
func (g *seeder) item(n int) (Item, []byte, []byte) {
	r := g.rnd
	country, denom, metal := seedCountries[r.IntN(len(seedCountries))], seedDenominations[r.IntN(len(seedDenominations))], seedMetals[r.IntN(len(seedMetals))]
	grade, mint := seedGrades[r.IntN(len(seedGrades))], seedMints[r.IntN(len(seedMints))]
	year := strconv.Itoa(1700 + r.IntN(325))
	it := Item{ID: g.prefix + strconv.Itoa(n), Status: StatusActive, Currency: seedCurrencies[r.IntN(len(seedCurrencies))]}
	if r.IntN(100) < 15 {
		it.Status = StatusInactive
	}
	if r.IntN(100) < 90 {
		coin := "C" + strconv.Itoa(100000+r.IntN(900000))
		it.CoinID = &coin
	}
	if r.IntN(100) < 80 {
		p := centsNumber(100 + r.IntN(500_000))
		it.Price = &p
	}
	if r.IntN(100) < 85 {
		c := seedCategories[r.IntN(len(seedCategories))]
		it.Category = json.RawMessage(`{"id":"` + c.id + `","name":"` + c.name + `"}`)
	}
	it.Characteristics = json.RawMessage(`{"country":"` + country[0] + `","diameter_mm":` + strconv.Itoa(15+r.IntN(30)) +
		`,"grade":"` + grade + `","metal":"` + metal[0] + `","mint":"` + mint + `","weight_g":` +
		strconv.Itoa(2+r.IntN(40)) + "." + strconv.Itoa(r.IntN(10)) + `,"year":` + year + `}`)
	it.Images = g.images(it.ID)
	it.Texts = map[string]Text{}
	for lang := range 3 {
		// Some translations and descriptions are missing, as in real catalogs.
		if lang > 0 && r.IntN(100) < 12 {
			continue
		}
		t := Text{Title: country[lang] + " " + denom[lang] + " " + year + " " + metal[lang] + " " + grade}
		if r.IntN(100) < 90 {
			t.Description = sprintf4(seedDescriptions[lang], country[lang], metal[lang], mint, grade)
		}
		it.Texts[Languages[lang]] = t
	}
	texts, _ := json.Marshal(it.Texts)
	images, _ := json.Marshal(it.Images)
	return it, texts, images
}

// images draws 1–6 images: obverse, reverse and edge first, then gallery.
func (g *seeder) images(id string) []Image {
	n := 1 + g.rnd.IntN(6)
	imgs := make([]Image, n)
	for i := range n {
		typ := "gallery"
		if i < 3 {
			typ = ImageTypes[i]
		}
		pos := strconv.Itoa(i + 1)
		imgs[i] = Image{ID: id + "-" + pos, URL: "https://img.coinexport.example/items/" + id + "/" + pos + ".jpg", Position: i + 1, Type: typ}
	}
	return imgs
}

// centsNumber writes cents/100 canonically (no trailing zeros), as the
// parser's canonicalDecimal would.
func centsNumber(cents int) json.Number {
	whole, frac := strconv.Itoa(cents/100), cents%100
	switch {
	case frac == 0:
		return json.Number(whole)
	case frac%10 == 0:
		return json.Number(whole + "." + strconv.Itoa(frac/10))
	case frac < 10:
		return json.Number(whole + ".0" + strconv.Itoa(frac))
	}
	return json.Number(whole + "." + strconv.Itoa(frac))
}

// sprintf4 fills the four %s of a description template without fmt's
// reflection; the seed renders millions of them.
func sprintf4(tmpl string, a, b, c, d string) string {
	args := [4]string{a, b, c, d}
	out := make([]byte, 0, len(tmpl)+64)
	k := 0
	for i := 0; i < len(tmpl); i++ {
		if tmpl[i] == '%' && i+1 < len(tmpl) && tmpl[i+1] == 's' && k < 4 {
			out = append(out, args[k]...)
			k++
			i++
			continue
		}
		out = append(out, tmpl[i])
	}
	return string(out)
}
